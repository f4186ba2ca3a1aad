"""Where a run's figures come from: code version, host and hardware, library versions (summary.json's
`provenance` and `versions`). The report pairs runs only from the same hardware unless told otherwise."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Dict, Optional

import torch

from ablate.metrics.host import cpu_model

REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def gpu_facts(device: torch.device) -> Dict[str, object]:
    if device.type != "cuda":
        return {"gpu_name": None, "gpu_count": 0, "gpu_driver": None, "nccl": None}
    driver = None
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception:
        pass
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    return {"gpu_name": torch.cuda.get_device_name(device), "gpu_count": torch.cuda.device_count(),
            "gpu_driver": driver, "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}


def record(device: torch.device) -> Dict[str, object]:
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": bool(dirty) if dirty is not None else None,
            "hostname": socket.gethostname(), "pid": os.getpid(), "cpu_model": cpu_model(), "cpu_cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cuda": torch.version.cuda, **gpu_facts(device)}


def versions() -> Dict[str, Optional[str]]:
    import hydra
    import omegaconf

    out = {"python": platform.python_version(), "torch": torch.__version__, "hydra": hydra.__version__,
           "omegaconf": omegaconf.__version__, "cuda": torch.version.cuda}
    for name in ("deepspeed", "wandb", "submitit"):   # metadata only: importing deepspeed is slow
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
