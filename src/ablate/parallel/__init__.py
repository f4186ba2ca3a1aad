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

from ablate.config import AblateConfig, ConfigError
from ablate.parallel import pipeline
from ablate.parallel.mesh import Layout, decode
from ablate.parallel.state_bytes import Breakdown
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
    dp: str = "replicate"            # how its data-parallel ranks hold the model: single | replicate | shard | hybrid
    tp_refused: Optional[str] = None  # why it does not compose with tensor parallelism (parallel.tp > 1), if not


# torchtitan composes TP with FSDP2/HSDP, not with DDP, for the same reason
NO_TP_DDP = ("torch's DistributedDataParallel takes no DTensor (tensor-parallel) parameters; for whole replicas "
             "that compose with TP use parallel=hsdp parallel.shard_size=1 (gradients all-reduced, as DDP)")
NO_TP_ZERO = "DeepSpeed's ZeRO keeps its own world and does not compose with torch's tensor parallelism here"

REGISTRY = {
    "none": Choice("local", "Local", needs_group=False, dp="single"),
    "ddp": Choice("ddp", "DDP", tp_refused=NO_TP_DDP),
    "ddp_sync": Choice("ddp", "DDP", tp_refused=NO_TP_DDP),
    "fsdp2": Choice("fsdp2", "FSDP2", shards_like_stage=3, checkpoint="dcp", dp="shard"),
    "hsdp": Choice("fsdp2", "FSDP2", shards_like_stage=3, checkpoint="dcp", dp="hybrid"),
    "zero1": Choice("zero", "Zero", zero_stage=1, shards_like_stage=1, checkpoint="deepspeed-1",
                    checkpoint_per_world=True, dp="shard", tp_refused=NO_TP_ZERO),
    "zero2": Choice("zero", "Zero", zero_stage=2, shards_like_stage=2, checkpoint="deepspeed-2",
                    checkpoint_per_world=True, dp="shard", tp_refused=NO_TP_ZERO),
    "zero3": Choice("zero", "Zero", zero_stage=3, shards_like_stage=3, checkpoint="deepspeed-3",
                    checkpoint_per_world=True, dp="shard", tp_refused=NO_TP_ZERO),
}


def choice(name: str) -> Choice:
    return REGISTRY[name]


def strategy_class(name: str) -> type:
    c = REGISTRY[name]
    return getattr(importlib.import_module(f"ablate.parallel.{c.module}"), c.cls)


def layout_of(cfg: AblateConfig) -> Layout:
    """The run's layout (mesh.py), decoded once: dp_replicate x dp_shard x tp; a one-line refusal if it cannot be."""
    c = REGISTRY[cfg.parallel.name]
    return decode(cfg, c.dp, c.tp_refused)


def check(cfg: AblateConfig, has_cuda: bool) -> None:
    """Combinations that cannot run, refused in one line before launch (each strategy says its own)."""
    layout_of(cfg)
    pipeline.check(cfg)
    p = cfg.parallel
    if (p.param_dtype is not None or p.reduce_dtype != "float32") and REGISTRY[p.name].module != "fsdp2":
        raise ConfigError(f"parallel.param_dtype / parallel.reduce_dtype with parallel={p.name}: FSDP2's mixed "
                          "precision (low-precision all-gathers); valid with parallel=fsdp2, hsdp, or leave both unset")
    moe = getattr(cfg.model, "moe", None)
    if moe is not None and moe.balance == "bias" and REGISTRY[p.name].module == "zero":
        raise ConfigError(f"model.moe.balance=bias with parallel={p.name}: the bias moves after each optimizer step "
                          "of torch's strategies, not inside DeepSpeed's engine; valid: model.moe.balance=aux_loss, or "
                          "parallel=none, ddp, ddp_sync, fsdp2, hsdp")
    strategy_class(p.name).check(p, Precision(cfg.precision), has_cuda)


def build(cfg: AblateConfig, model, device, layout: Layout, mesh, cut=None):
    """The strategy for `parallel=` over the run's mesh, owning the numerics of `precision=` (see precision.py).
    fp8 layers are converted first, then tensor parallelism splits the layers (tp.py) and expert parallelism the
    experts (ep.py), then the model is cut into
    this rank's pipeline stages (`cut`: model/stages.py's split), then torch.compile (per block), then the strategy
    wraps the model over the data-parallel dims (torchtitan's order)."""
    prec = Precision(cfg.precision, device)
    model = prec.prepare_model(model)
    if layout.tp > 1:   # (DTensor's import, 0.6 s, paid by the runs that split layers only)
        from ablate.parallel import tp

        tp.parallelize(model, cfg.model, mesh["tp"], cfg.parallel.vocab_parallel)
    if layout.ep > 1:   # a mixture's experts split over ep, its tokens sent to them (ep.py)
        from ablate.parallel import ep

        ep.parallelize(model, mesh["ep"])
    if cut is not None:   # this rank's pipeline stages (model/stages.py, outlined before any layer was split)
        model = cut(model)
    if cfg.train.compile:   # per block, as torchtitan does: identical blocks share one compiled graph, so a
        for block in model.blocks.modules or [model]:   # 16-layer 1B model compiles one block (seconds)
            block.compile()
    strategy = strategy_class(cfg.parallel.name)(model, cfg.parallel, cfg.train, cfg.optim, prec, device, layout,
                                                 mesh)
    if cut is not None:   # the schedule owns the step (over the stages as the strategy wrapped them)
        strategy.pipeline = pipeline.Schedule(strategy.model, cfg, mesh, device)
    return strategy


def plan_bytes(numels: List[int], cfg: AblateConfig, layout: Layout = None,
               split: Optional[List[bool]] = None) -> Breakdown:
    """Per-rank bytes of parameters, gradients and optimizer state this strategy allocates on the layout: tensor
    parallelism divides the layers it splits by tp (`split`, per parameter: the model's plan, model/facts.py
    split_flags; None: every one), the rest stay whole on each tp rank; then the strategy divides by its shard
    group."""
    layout = layout or layout_of(cfg)
    per_tp = [n / layout.tp if split is None or s else float(n) for n, s in zip(numels, split or [True] * len(numels))]
    return strategy_class(cfg.parallel.name).plan_bytes(per_tp, cfg.parallel, Precision(cfg.precision), layout)


__all__ = ["REGISTRY", "Choice", "Layout", "build", "check", "choice", "layout_of", "plan_bytes"]
