"""ablate: a Hydra-driven experiment and ablation harness for PyTorch training."""
import os
from pathlib import Path

__version__ = "0.1.0"

# The config groups and the sweep files ship inside the package (a wheel or `pip install .` has them);
# the repository root links to them as conf/ and sweeps/. conf/sweeps is the `sweeps` group.
CONF_DIR = Path(__file__).resolve().parent / "conf"
SWEEPS_DIR = CONF_DIR / "sweeps"


def user_cache_dir() -> Path:
    """Where measured peaks and the host's noise floor are kept between runs: ABLATE_CACHE_DIR, else
    $XDG_CACHE_HOME/ablate (~/.cache/ablate)."""
    return Path(os.environ.get("ABLATE_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "ablate"
                ).expanduser()


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask (taskset, a cpuset) where the OS has one (Linux),
    else every core of the host (macOS has no sched_getaffinity)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
