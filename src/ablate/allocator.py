"""conf/allocator -> the CUDA caching allocator's environment.

The allocator reads its settings once, when CUDA starts, so `apply` must run before any CUDA call
(`__main__` calls it first thing; local ranks take the launcher's environment, launcher/local.py, and
Slurm tasks inherit it).
PyTorch documents PYTORCH_ALLOC_CONF as the main name and PYTORCH_CUDA_ALLOC_CONF as the older alias;
we set both so any torch version reads it.
"""
from __future__ import annotations

import os
from typing import Dict

from ablate.config import AllocatorConfig

ENV_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def alloc_conf(cfg: AllocatorConfig) -> str:
    """The comma-separated setting string, e.g. 'expandable_segments:True,max_split_size_mb:128'."""
    parts = []
    if cfg.expandable_segments:
        parts.append("expandable_segments:True")
    if cfg.max_split_size_mb is not None:
        parts.append(f"max_split_size_mb:{cfg.max_split_size_mb}")
    if cfg.garbage_collection_threshold is not None:
        parts.append(f"garbage_collection_threshold:{cfg.garbage_collection_threshold}")
    if cfg.extra:
        parts.append(cfg.extra)
    return ",".join(parts)


def apply(cfg: AllocatorConfig) -> Dict[str, object]:
    """Write the setting into os.environ; return what was applied, for the run's record."""
    value = alloc_conf(cfg)
    for name in ENV_NAMES:
        if value:
            os.environ[name] = value
    record: Dict[str, object] = {"choice": cfg.name, "env": {n: value for n in ENV_NAMES} if value else {}}
    import torch  # imported here: torch must not start CUDA before the variables above are set

    if not torch.cuda.is_available():
        record["applicable"] = False
        record["reason"] = "no CUDA device: the CUDA caching allocator is not used on this machine"
    else:
        record["applicable"] = True
    return record


def segments_check(segments, asked_expandable: bool) -> Dict[str, object]:
    """Whether the setting took, from the allocator's own record: each segment of
    `torch.cuda.memory_snapshot()` says `is_expandable`. A setting read too late (CUDA started before the
    environment was set) leaves every segment non-expandable."""
    expandable = sum(1 for s in segments if s.get("is_expandable"))
    record: Dict[str, object] = {"asked_expandable": asked_expandable, "segments": len(segments),
                                 "expandable_segments": expandable}
    if segments:
        record["took"] = (expandable == len(segments)) if asked_expandable else expandable == 0
        if not record["took"]:
            record["reason"] = (f"{expandable} of {len(segments)} segments expandable while expandable_segments="
                                f"{asked_expandable}: the allocator read other settings (CUDA started first?)")
    else:
        record["took"] = None
        record["reason"] = "no CUDA memory segments to inspect"
    return record


def check_took(cfg: AllocatorConfig, device) -> Dict[str, object]:
    """summary.json's `allocator_check`: the setting as the CUDA allocator holds it at the end of the run."""
    if getattr(device, "type", "cpu") != "cuda":
        return {"asked_expandable": cfg.expandable_segments, "took": None,
                "reason": "no CUDA device: nothing to inspect (the allocator settings apply to CUDA only)"}
    import torch

    return segments_check(torch.cuda.memory_snapshot(), cfg.expandable_segments)
