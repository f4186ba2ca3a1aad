"""ablate: a Hydra-driven experiment and ablation harness for PyTorch training."""
from pathlib import Path

__version__ = "0.1.0"

# conf/ and sweeps/ live at the repository root (the layout users asked for); conf/sweeps links to sweeps/
# so Hydra finds the sweep files as the `sweeps` group without searching anything else.
_REPO = Path(__file__).resolve().parents[2]
CONF_DIR = _REPO / "conf"
SWEEPS_DIR = _REPO / "sweeps"
