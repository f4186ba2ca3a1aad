"""report/: claimed vs measured, from run directories only (never imports the trainer).

cli.py (`python -m ablate.report`) -> compare.py (groups, checks, verdicts) -> runs.py (arms and repeats from
summary.json + config.yaml) -> stats.py (intervals and the verdict rule) -> output.py (report.md, CSV,
PNG) -> timeline.py (the overlap picture of a profiled step); outliers.py (runs unlike their repeats,
stalls) and noise.py (each sweep's own noise, the host's A/A floor with its address) beside them.
"""
from ablate.report.cli import main
from ablate.report.compare import build

__all__ = ["build", "main"]
