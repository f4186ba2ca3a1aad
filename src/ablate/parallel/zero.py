"""parallel=zero1|zero2|zero3: DeepSpeed ZeRO through the real `deepspeed.initialize`.

Stage 1 partitions optimizer states, 2 adds gradients, 3 adds parameters (gathered on use, with
`overlap_comm` prefetching the next ones while the current layer computes). The DeepSpeed JSON config
is generated from the Hydra nodes (`ds_config`).

Numerics: fp32 and bf16 run DeepSpeed's float32 engine (float32 partitions are the master weights,
gradients reduced in float32) with bf16 compute under autocast: the same meaning as under ddp/fsdp2.
fp16 cannot match: it is DeepSpeed's fp16 mode (float16 working weights and reduced gradients, float32
master partitions, DeepSpeed's dynamic loss scaler fed from the precision node); the run records so.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Dict, Optional

import torch

from ablate import optim
from ablate.config import ConfigError, ParallelConfig, PrecisionConfig, TrainConfig
from ablate.metrics.counting import CollectiveCounter, CommCounter
from ablate.parallel import choice
from ablate.parallel.base import Strategy
from ablate.parallel.comm_model import zero_working_bytes
from ablate.parallel.mesh import Layout, group_names, world_dim
from ablate.parallel.state_bytes import Breakdown, optimizer_state_bytes, storages, tensor_bytes
from ablate.precision import Precision


def fp16_section(precision: PrecisionConfig) -> Dict:
    """The precision node's loss-scaler fields as DeepSpeed's fp16 config (dynamic scaling)."""
    return {"enabled": True, "loss_scale": 0, "initial_scale_power": int(math.log2(precision.init_scale)),
            "loss_scale_window": precision.growth_interval, "hysteresis": 1, "min_loss_scale": 1}


def ds_config(cfg: ParallelConfig, train: TrainConfig, precision: Precision, world_size: int) -> Dict:
    stage = choice(cfg.name).zero_stage
    zero = {"stage": stage, "overlap_comm": cfg.overlap_comm,
            "contiguous_gradients": cfg.contiguous_gradients, "reduce_bucket_size": cfg.reduce_bucket_size,
            "allgather_bucket_size": cfg.allgather_bucket_size}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=cfg.stage3_prefetch_bucket_size,
                    stage3_param_persistence_threshold=cfg.stage3_param_persistence_threshold)
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    scaled = precision.spec.loss_scaling
    return {
        "train_micro_batch_size_per_gpu": train.batch_size,
        "gradient_accumulation_steps": train.grad_accum,
        "train_batch_size": train.batch_size * train.grad_accum * world_size,
        "gradient_clipping": train.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": False},          # bf16 is autocast over the float32 engine (module docstring)
        "fp16": fp16_section(precision.cfg) if scaled else {"enabled": False},
        "zero_allow_untested_optimizer": True,
        # a torch AdamW with optimizer offload: DeepSpeed 0.19 refuses it unless told not to force its own
        "zero_force_ds_cpu_optimizer": False,
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


def deepspeed_loss_scale(optimizer) -> Optional[float]:
    """The current scale of DeepSpeed's loss scaler (ZeRO optimizers keep it as `loss_scaler`)."""
    scaler = getattr(optimizer, "loss_scaler", None)
    return float(scaler.cur_scale) if scaler is not None else None


def skip_shared_memory_allreduce(deepspeed) -> None:
    """DeepSpeed's CPU backend compiles its shared-memory all-reduce (deepspeed_shm_comm, C++ with OpenMP) when
    its process group starts: 30-45 s on a machine (and venv) that has not built it, and a kernel only
    `inference_all_reduce` calls; training's collectives go through torch.distributed (gloo here). Marked
    incompatible (DeepSpeed keeps the probe's dict for such edits: deepspeed/ops/__init__.py), the backend
    starts without it (deepspeed/comm/torch.py `build_shm_op`)."""
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


class Zero(Strategy):
    """The Strategy interface over a DeepSpeed engine (it owns backward, accumulation and the step)."""

    overlap_needs_streams = True
    # deepspeed.initialize imports DeepSpeed's Muon optimizer (runtime/zero/utils.py, is_zero_supported_optimizer),
    # whose module-level torch.compile decorator imports inductor: ~3 s of CPU per rank (py-spy, 2 ranks of zero3)
    rank_imports = ("torch._inductor.compile_fx", "torch._dynamo.repro.after_dynamo")

    def __init__(self, model, parallel: ParallelConfig, train: TrainConfig, optim_cfg, precision, device,
                 layout: Layout, mesh):
        self.comm = CommCounter()
        # before DeepSpeed captures the functions; its own groups are the world's ranks: the dp_shard dim
        self.counter = CollectiveCounter(self.comm, group_names(mesh), world_dim(layout) or "dp_shard").install()
        if device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")      # said, not guessed: no detection warning
        import deepspeed

        if device.type == "cpu":
            skip_shared_memory_allreduce(deepspeed)

        self.train, self.precision, self.device = train, precision, device
        self.config = ds_config(parallel, train, precision, layout.dp)
        self.scaled = precision.spec.loss_scaling
        optimizer = optim.build(model.parameters(), optim_cfg)
        self.optimizer_record = optim.describe(optimizer)
        self.model, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                                config=self.config)
        self.measured_state: Dict[str, int] = {}
        self._last = True
        if self.scaled:
            self.numerics = precision.record(torch.float16, torch.float32, torch.float16, "deepspeed",
                                             note="DeepSpeed's fp16 mode: fp16 working weights and reduced "
                                                  "gradients, fp32 master partitions (cannot match the torch "
                                                  "strategies' fp32 weights)")
        else:
            self.numerics = precision.record(torch.float32, torch.float32, torch.float32, "none")

    @classmethod
    def check(cls, parallel, precision: Precision, has_cuda: bool) -> None:
        spec, name, precision = precision.spec, parallel.name, precision.cfg
        if spec.fp8_matmuls:
            raise ConfigError(f"parallel={name} with precision=fp8: not supported; valid: fp32, bf16, fp16 "
                              "(or parallel=none, ddp, fsdp2 with fp8)")
        if not spec.loss_scaling:
            return
        if not has_cuda:
            raise ConfigError(f"parallel={name} with precision={precision.name}: DeepSpeed refuses fp16 on a "
                              "CPU; valid here: precision=fp32, bf16")
        if (precision.growth_factor, precision.backoff_factor) != (2.0, 0.5):
            raise ConfigError(f"parallel={name}: precision.growth_factor={precision.growth_factor}, "
                              f"backoff_factor={precision.backoff_factor}: DeepSpeed's loss scaler only grows "
                              "x2 and backs off /2; valid: 2.0 and 0.5")
        if math.log2(precision.init_scale) != int(math.log2(precision.init_scale)):
            raise ConfigError(f"parallel={name}: precision.init_scale={precision.init_scale}: DeepSpeed takes "
                              "a power of two (initial_scale_power)")

    @classmethod
    def plan_bytes(cls, numels, parallel, precision: Precision, layout) -> Breakdown:
        n, world = float(sum(numels)), layout.dp_shard   # ZeRO partitions over its whole (data-parallel) world
        w = zero_working_bytes(precision.cfg.name)   # fp16 working weights, else the fp32 engine
        master = 4 * n / world                             # DeepSpeed's fp32 partition (stages 1-2: always)
        if choice(parallel.name).zero_stage in (1, 2):
            return Breakdown(w * n, w * n / world, master + 8 * n / world)
        persistent = sum(k for k in numels if k < parallel.stage3_param_persistence_threshold)
        master = master if w == 2 else 0.0                 # fp32 engine: the partition itself is the master
        return Breakdown(w * n / world + w * persistent, w * n / world, master + 8 * n / world)

    def autocast(self):
        return self.precision.autocast()

    def micro_step(self, last: bool):
        import contextlib

        self._last = last
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        # the loop already divided by grad_accum; DeepSpeed must not divide again (it scales for fp16)
        self.model.backward(loss, scale_wrt_gas=False)
        if not self._last:
            self.model.step()          # a micro-step: DeepSpeed only accumulates here

    def step(self, measure_state: bool = False) -> torch.Tensor:
        if measure_state:
            self.measured_state = self.state_bytes()   # while the gradients still exist
        self.model.step()              # the accumulation boundary: reduce, clip, update, zero
        norm = self.model.get_global_grad_norm()     # None when DeepSpeed did not compute one
        return None if norm is None else torch.as_tensor(float(norm))

    def loss_scale(self) -> Optional[float]:
        return deepspeed_loss_scale(self.optimizer) if self.scaled else None

    def local_state(self):
        params = list(self.model.module.parameters())
        return [getattr(p, "ds_tensor", None) if hasattr(p, "ds_tensor") else p.detach() for p in params]

    @property
    def optimizer_param_groups(self):
        return self.optimizer.param_groups

    def skipped_steps(self) -> int:
        return int(self.model.skipped_steps)

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
        """DeepSpeed's own format: every rank writes its partition of the ZeRO state (loss scaler included)."""
        self.model.save_checkpoint(str(directory / "deepspeed"), tag="latest", save_latest=False)

    def missing_for(self, directory: Path, rank: int) -> Optional[str]:
        """DeepSpeed's files for this rank (its optimizer partition; its model shard under stage 3, else the
        one model file), as deepspeed/runtime/engine.py names them (mp_rank 00: no tensor parallelism)."""
        stage = self.config["zero_optimization"]["stage"]
        model = f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt"
        for name in (f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", model):
            if not (directory / "deepspeed" / "latest" / name).is_file():
                return f"{directory.name}/deepspeed/latest/{name} is missing"
        return None

    def load_checkpoint(self, directory: Path) -> None:
        path, _ = self.model.load_checkpoint(str(directory / "deepspeed"), tag="latest")
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint under {directory / 'deepspeed'}")

    def close(self) -> None:
        self.counter.uninstall()
