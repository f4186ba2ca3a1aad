"""The allocator and NCCL groups' process environment, applied before any CUDA call or process group
(ranks and Slurm tasks inherit it). Shared by every launcher; the record goes into summary.json."""
from __future__ import annotations

from typing import Dict

from ablate import allocator, nccl
from ablate.config import AblateConfig


def apply(cfg: AblateConfig) -> Dict[str, object]:
    return {"allocator": allocator.apply(cfg.allocator), "nccl": nccl.apply(cfg.nccl)}
