"""`python -m ablate.plan` (plan/__init__.py)."""
import sys

from ablate.plan import main

sys.exit(main())
