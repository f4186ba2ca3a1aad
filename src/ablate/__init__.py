"""ablate: a Hydra-driven experiment and ablation harness for PyTorch training."""
from pathlib import Path

__version__ = "0.1.0"

# The config groups and the sweep files ship inside the package (a wheel or `pip install .` has them);
# the repository root links to them as conf/ and sweeps/. conf/sweeps is the `sweeps` group.
CONF_DIR = Path(__file__).resolve().parent / "conf"
SWEEPS_DIR = CONF_DIR / "sweeps"
