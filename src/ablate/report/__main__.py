"""`python -m ablate.report DIR [DIR ...]` (report/cli.py)."""
import sys

from ablate.report.cli import main

sys.exit(main())
