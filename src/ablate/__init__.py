"""ablate: a Hydra-driven experiment and ablation harness for PyTorch training."""
from pathlib import Path

__version__ = "0.1.0"

# conf/ and sweeps/ live at the repository root (the layout users asked for); a wheel carries a copy
# inside the package (see pyproject.toml).
_REPO = Path(__file__).resolve().parents[2]
_PACKAGED = Path(__file__).resolve().parent / "_data"
CONF_DIR = _REPO / "conf" if (_REPO / "conf").is_dir() else _PACKAGED / "conf"
SWEEPS_DIR = _REPO / "sweeps" if (_REPO / "sweeps").is_dir() else _PACKAGED / "sweeps"
