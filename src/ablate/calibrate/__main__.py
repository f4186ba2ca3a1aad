"""`python -m ablate.calibrate` (calibrate/__init__.py)."""
import sys

from ablate.calibrate import main

sys.exit(main())
