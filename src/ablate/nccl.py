"""conf/nccl -> NCCL and CUDA environment variables, set before any process group exists."""
from __future__ import annotations

import os
from typing import Dict

from ablate.config import NcclConfig


def async_error_handling_name() -> str:
    """torch >= 2.2 reads TORCH_NCCL_ASYNC_ERROR_HANDLING; older releases read NCCL_ASYNC_ERROR_HANDLING."""
    import torch

    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return "TORCH_NCCL_ASYNC_ERROR_HANDLING" if (major, minor) >= (2, 2) else "NCCL_ASYNC_ERROR_HANDLING"


def env_for(cfg: NcclConfig) -> Dict[str, str]:
    env = {k: str(v) for k, v in cfg.env.items()}
    if cfg.async_error_handling is not None:
        env[async_error_handling_name()] = str(cfg.async_error_handling)
    return env


def apply(cfg: NcclConfig) -> Dict[str, object]:
    """Write the variables into os.environ; return what was applied, for the run's record."""
    env = env_for(cfg)
    os.environ.update(env)
    import torch

    record: Dict[str, object] = {"choice": cfg.name, "env": env}
    if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
        record["applicable"] = False
        record["reason"] = "no CUDA/NCCL here: gloo carries the collectives, NCCL variables have no effect"
    else:
        record["applicable"] = True
    return record
