"""conf/parallel -> one small interface, one file per strategy.

The training step only ever calls: `strategy.model(...)`, `strategy.micro_step(last)` (a context for
one micro-step), `strategy.backward(loss)` and `strategy.step()` (returns the gradient norm).
Each strategy also counts its own data-parallel communication (`comm`) and reports the bytes of
model state this rank holds (`state_bytes()`), so ablations of C2/C3 read measured figures.
"""
from __future__ import annotations

from ablate.config import ParallelConfig, TrainConfig
from ablate.parallel.base import CommCounter, Strategy


def build(cfg: ParallelConfig, model, train: TrainConfig, precision, device, world_size: int) -> Strategy:
    if cfg.name == "none":
        from ablate.parallel.local import Local

        return Local(model, train, precision, device)
    raise NotImplementedError(f"parallel={cfg.name} is not available yet")


__all__ = ["build", "Strategy", "CommCounter"]
