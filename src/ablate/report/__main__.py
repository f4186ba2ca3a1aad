"""`python -m ablate.report DIR [DIR ...]` (report/compare.py)."""
import sys

from ablate.report.compare import main

sys.exit(main())
