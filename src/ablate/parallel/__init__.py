"""conf/parallel -> one small interface, one file per strategy.

The training step only ever calls: `strategy.model(...)`, `strategy.micro_step(last)` (a context for
one micro-step), `strategy.backward(loss)` and `strategy.step()` (returns the gradient norm).
Each strategy also counts its own data-parallel communication (`comm`) and reports the bytes of
model state this rank holds (`state_bytes()`), so ablations of C2/C3 read measured figures.
"""
from __future__ import annotations

from ablate.config import AblateConfig, ConfigError, ParallelConfig, TrainConfig
from ablate.parallel.base import CommCounter, Strategy


def check(cfg: AblateConfig, has_cuda: bool) -> None:
    """Combinations that cannot run, refused in one line before launch."""
    name, prec = cfg.parallel.name, cfg.precision.name
    if name.startswith("zero") and prec == "fp16" and not has_cuda:
        raise ConfigError(f"parallel={name} with precision=fp16: DeepSpeed refuses fp16 on a CPU; "
                          "valid here: precision=fp32, bf16")
    if name.startswith("zero") and prec == "fp8":
        raise ConfigError(f"parallel={name} with precision=fp8: not supported; valid: fp32, bf16, fp16 "
                          "(or parallel=none, ddp, fsdp2 with fp8)")
    if name == "fsdp2" and prec == "fp16":
        raise ConfigError("parallel=fsdp2 with precision=fp16: the GradScaler does not handle sharded "
                          "gradients here; valid: precision=fp32, bf16")


def build(cfg: ParallelConfig, model, train: TrainConfig, precision, device, world_size: int):
    if cfg.name == "none":
        from ablate.parallel.local import Local

        return Local(model, train, precision, device)
    if cfg.name == "ddp":
        from ablate.parallel.ddp import DDP

        return DDP(model, train, precision, device, no_sync=cfg.no_sync)
    if cfg.name == "fsdp2":
        from ablate.parallel.fsdp2 import FSDP2

        return FSDP2(model, train, precision, device, reshard_after_forward=cfg.reshard_after_forward)
    from ablate.parallel.zero import Zero

    return Zero(model, cfg, train, precision, device, world_size)


__all__ = ["build", "check", "Strategy", "CommCounter"]
