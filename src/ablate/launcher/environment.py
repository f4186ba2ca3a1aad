"""The allocator and NCCL groups' process environment, applied before any CUDA call or process group
(ranks and Slurm tasks inherit it). Shared by every launcher; the record goes into summary.json, with
what the process environment really holds afterwards (`process_env`). A run inside a longer-lived
process (tests, an embedding caller) gets the previous values back when it ends."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Dict, Iterator

from ablate import allocator, nccl
from ablate.config import AblateConfig


def names(cfg: AblateConfig) -> list:
    return list(allocator.ENV_NAMES) + sorted(nccl.env_for(cfg.nccl)) + [nccl.async_error_handling_name()]


def apply(cfg: AblateConfig) -> Dict[str, object]:
    record = {"allocator": allocator.apply(cfg.allocator), "nccl": nccl.apply(cfg.nccl)}
    for group, keys in (("allocator", allocator.ENV_NAMES), ("nccl", sorted(nccl.env_for(cfg.nccl)))):
        record[group]["process_env"] = {k: os.environ.get(k) for k in keys}
    return record


@contextmanager
def applied(cfg: AblateConfig) -> Iterator[Dict[str, object]]:
    """apply(), then put back whatever the variables were (absent ones removed) when the run ends."""
    before = {k: os.environ.get(k) for k in names(cfg)}
    try:
        yield apply(cfg)
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
