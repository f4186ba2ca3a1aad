"""`python -m ablate.maxbatch` (maxbatch/__init__.py)."""
import sys

from ablate.maxbatch import main

sys.exit(main())
