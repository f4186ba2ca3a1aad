"""parallel=zero1|zero2|zero3: DeepSpeed ZeRO through the real `deepspeed.initialize`.

Stage 1 partitions optimizer states, 2 adds gradients, 3 adds parameters (gathered on use, with
`overlap_comm` prefetching the next ones while the current layer computes). The DeepSpeed JSON config
is generated from the Hydra node (`ds_config`), and saved in the run directory.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

import torch

from ablate.config import ParallelConfig, TrainConfig
from ablate.metrics.comm import CollectiveCounter
from ablate.parallel.base import CommCounter, make_adamw, optimizer_state_bytes, storages, tensor_bytes


def ds_config(cfg: ParallelConfig, train: TrainConfig, precision: str, world_size: int) -> Dict:
    zero = {"stage": cfg.zero_stage, "overlap_comm": cfg.overlap_comm,
            "contiguous_gradients": cfg.contiguous_gradients, "reduce_bucket_size": cfg.reduce_bucket_size,
            "allgather_bucket_size": cfg.allgather_bucket_size}
    if cfg.zero_stage == 3:
        zero.update(stage3_prefetch_bucket_size=cfg.stage3_prefetch_bucket_size,
                    stage3_param_persistence_threshold=cfg.stage3_param_persistence_threshold)
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": train.batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "train_batch_size": train.batch_size * train.grad_accum * world_size,
        "gradient_clipping": train.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "initial_scale_power": 16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _tensors(value):
    """Tensors inside DeepSpeed's containers (dicts of lists of tensors, lists of lists...)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


class Zero:
    """The strategy interface over a DeepSpeed engine (it owns backward, accumulation and the step)."""

    def __init__(self, model, cfg: ParallelConfig, train: TrainConfig, precision, device, world_size: int):
        self.comm = CommCounter()
        self.counter = CollectiveCounter(self.comm).install()   # before DeepSpeed captures the functions
        if device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")      # said, not guessed: no detection warning
        import deepspeed

        self.train, self.precision, self.device, self.stage = train, precision, device, cfg.zero_stage
        self.config = ds_config(cfg, train, precision.cfg.name, world_size)
        optimizer = make_adamw(model.parameters(), train)
        self.model, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                                config=self.config)
        self.measured_state: Dict[str, int] = {}
        self._last = True

    def micro_step(self, last: bool):
        self._last = last
        import contextlib

        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        # the loop already divided by grad_accum; DeepSpeed must not divide again
        self.model.backward(loss, scale_wrt_gas=False)
        if not self._last:
            self.model.step()          # a micro-step: DeepSpeed only accumulates here

    def step(self, measure_state: bool = False) -> torch.Tensor:
        if measure_state:
            self.measured_state = self.state_bytes()   # while the gradients still exist
        self.model.step()              # the accumulation boundary: reduce, clip, update, zero
        norm = self.model.get_global_grad_norm()
        return torch.as_tensor(float("nan") if norm is None else float(norm))

    def _base_optimizer(self):
        return getattr(self.optimizer, "optimizer", self.optimizer)

    def state_bytes(self) -> Dict[str, int]:
        """What this rank holds, by distinct memory buffers: parameters (full ones, ZeRO-3 partitions and
        the small parameters ZeRO-3 persists whole), gradients (on the model or in ZeRO's partition
        buffers), fp32 master partitions and Adam moments."""
        zero = self.optimizer
        base = getattr(zero, "optimizer", zero)
        params = list(self.model.module.parameters())
        held = storages([p.data for p in params] + [getattr(p, "ds_tensor", None) for p in params])
        grads = [p.grad for p in params] + list(_tensors(getattr(zero, "averaged_gradients", None)))
        grads += [getattr(zero, "grad_partitions_flat_buffer", None), getattr(zero, "ipg_buffer", None)]
        masters = [p for group in base.param_groups for p in group["params"]]
        grads += [m.grad for m in masters]
        grad_mem = storages(t for t in grads if isinstance(t, torch.Tensor))
        opt = tensor_bytes(masters, exclude={**held, **grad_mem}) + optimizer_state_bytes(base)
        return {"params": sum(held.values()), "grads": sum(n for p, n in grad_mem.items() if p not in held),
                "optimizer": opt}

    def save_checkpoint(self, directory: Path) -> None:
        """DeepSpeed's own format: every rank writes its partition of the ZeRO state."""
        self.model.save_checkpoint(str(directory / "deepspeed"), tag="latest", save_latest=False)

    def load_checkpoint(self, directory: Path) -> None:
        path, _ = self.model.load_checkpoint(str(directory / "deepspeed"), tag="latest")
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint under {directory / 'deepspeed'}")

    def close(self) -> None:
        self.counter.uninstall()
