"""conf/parallel -> one interface (base.Strategy), one file per strategy, one registry (`REGISTRY`).

A strategy receives the precision decoded once (precision.Precision: the config and its Numerics) in
`check`, `plan_bytes` and its constructor alike. The training step only ever calls the Strategy
interface: `autocast()`, `model(x, y)`, `micro_step(last)`, `backward(loss)`, `step()`. Each strategy
also counts its own data-parallel communication (`comm`), reports the bytes of model state this rank
holds, declares the numerics it runs with, and predicts its per-rank state for `ablate.plan`
(`plan_bytes`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import List, Optional

from ablate.config import AblateConfig, OptimConfig, ParallelConfig, PrecisionConfig, TrainConfig
from ablate.precision import Precision


@dataclass(frozen=True)
class Choice:
    """Where a `parallel=` choice is implemented."""
    module: str                      # src/ablate/parallel/<module>.py
    cls: str                         # the Strategy subclass in it
    zero_stage: Optional[int] = None  # DeepSpeed ZeRO stage
    shards_like_stage: int = 0       # what the ZeRO paper's accounting compares it with (fsdp2 = 3)
    needs_group: bool = True         # joins a process group even on one process
    checkpoint: str = "torch"        # its checkpoint's file layout: a resume keeps the layout
    checkpoint_per_world: bool = False  # the files are cut for one world size (DeepSpeed's partitions)


REGISTRY = {
    "none": Choice("local", "Local", needs_group=False),
    "ddp": Choice("ddp", "DDP"),
    "ddp_sync": Choice("ddp", "DDP"),
    "fsdp2": Choice("fsdp2", "FSDP2", shards_like_stage=3, checkpoint="dcp"),
    "zero1": Choice("zero", "Zero", zero_stage=1, shards_like_stage=1, checkpoint="deepspeed-1",
                    checkpoint_per_world=True),
    "zero2": Choice("zero", "Zero", zero_stage=2, shards_like_stage=2, checkpoint="deepspeed-2",
                    checkpoint_per_world=True),
    "zero3": Choice("zero", "Zero", zero_stage=3, shards_like_stage=3, checkpoint="deepspeed-3",
                    checkpoint_per_world=True),
}


def choice(name: str) -> Choice:
    return REGISTRY[name]


def strategy_class(name: str) -> type:
    c = REGISTRY[name]
    return getattr(importlib.import_module(f"ablate.parallel.{c.module}"), c.cls)


def check(cfg: AblateConfig, has_cuda: bool) -> None:
    """Combinations that cannot run, refused in one line before launch (each strategy says its own)."""
    strategy_class(cfg.parallel.name).check(cfg.parallel, Precision(cfg.precision), has_cuda)


def build(parallel: ParallelConfig, precision: PrecisionConfig, model, train: TrainConfig, optim_cfg: OptimConfig,
          device, world_size: int):
    """The strategy for `parallel=`, owning the numerics of `precision=` (see precision.py).
    fp8 layers are converted before torch.compile, which comes before the strategy wraps the model."""
    prec = Precision(precision, device)
    model = prec.prepare_model(model)
    if train.compile:   # per block, as torchtitan does: identical blocks share one compiled graph, so a
        for block in model.blocks.modules or [model]:   # 16-layer 1B model compiles one block (seconds)
            block.compile()
    return strategy_class(parallel.name)(model, parallel, train, optim_cfg, prec, device, world_size)


def plan_bytes(numels: List[int], cfg: AblateConfig):
    """Per-rank bytes of parameters, gradients and optimizer state this strategy allocates."""
    return strategy_class(cfg.parallel.name).plan_bytes(numels, cfg.parallel, Precision(cfg.precision),
                                                        cfg.launcher.world_size)


__all__ = ["REGISTRY", "Choice", "build", "check", "choice", "plan_bytes"]
