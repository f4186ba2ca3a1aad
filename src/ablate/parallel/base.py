"""The strategy interface every parallel choice implements, and the torch-side base of none/ddp/fsdp2.

A strategy owns the run's numerics: it alone decides whether autocast is on, what the parameters,
master weights and reduced gradients are stored in, and who scales the loss (`numerics`). The loop,
the meter and checkpoints ask it; nobody else decodes a precision or strategy name.
"""
from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist

from ablate import optim
from ablate.config import OptimConfig, TrainConfig, UserOptimConfig
from ablate.metrics.counting import CollectiveCounter, CommCounter, paused
from ablate.metrics.experts import mixtures_of
from ablate.optim import by_mesh, is_dtensor
from ablate.parallel.mesh import Layout, exchanges, group_names, world_dim
from ablate.parallel.pipeline import pp_norm
from ablate.parallel.state_bytes import Breakdown, optimizer_state_bytes, tensor_bytes
from ablate.precision import Precision


class Strategy(ABC):
    """What the training loop, the meter and checkpoints ask of a parallel strategy.

    Attributes every strategy sets: `model` (called as model(x, y) -> loss), `comm` (its measured
    data-parallel communication), `measured_state` (state bytes at the last step), `numerics` (what it
    stores, computes and reduces in: summary.json's `numerics`), `optimizer_record` (the optimizer it built:
    summary.json's `optimizer`, optim.describe)."""

    model: torch.nn.Module
    comm: CommCounter
    measured_state: Dict[str, int]
    numerics: Dict[str, object]
    overlap_needs_streams = False    # its overlap of communication relies on device streams (DeepSpeed)
    pipeline = None                  # parallel.pp > 1: the schedule that owns the step (parallel/pipeline.py)
    # modules every rank of this strategy imports on its way: the local launcher's fork server imports them once
    # for all its ranks (launcher/local.py), instead of each rank paying for them
    rank_imports: Tuple[str, ...] = ()

    @classmethod
    def check(cls, parallel, precision: Precision, has_cuda: bool) -> None:
        """Refuse (ConfigError, one line) a combination this strategy cannot run. Default: none."""
        return

    @classmethod
    @abstractmethod
    def plan_bytes(cls, numels, parallel, precision: Precision, layout) -> Breakdown:
        """Predicted per-rank state bytes for parameters of these sizes (already divided by the tensor-parallel
        degree) on the layout (mesh.Layout) (ablate.plan; tests compare)."""

    @abstractmethod
    def autocast(self):
        """Context for the forward pass (autocast on or off, as this strategy's numerics say)."""

    def micro_step(self, last: bool):
        """Context for one micro-step; `last` is the one whose backward ends the accumulation."""
        return contextlib.nullcontext()

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-step's loss (already divided by grad_accum)."""

    @abstractmethod
    def step(self, measure_state: bool = False) -> torch.Tensor:
        """The optimizer step; returns the gradient norm (a device tensor, no host sync).
        `measure_state` records `state_bytes()` while the gradients still exist."""

    @abstractmethod
    def loss_scale(self) -> Optional[float]:
        """The current dynamic loss scale, from whichever engine scales the loss; None without scaling."""

    @abstractmethod
    def skipped_steps(self) -> int:
        """Optimizer steps skipped so far because gradients overflowed."""

    @abstractmethod
    def state_bytes(self) -> Dict[str, int]:
        """Bytes of parameters, gradients and optimizer state held by this rank."""

    @abstractmethod
    def local_state(self) -> Iterable[torch.Tensor]:
        """The parameter tensors this rank holds (its shards/partitions)."""

    @property
    @abstractmethod
    def optimizer_param_groups(self) -> List[Dict]:
        """The optimizer's param groups (lr, betas, weight_decay live there)."""

    def finite_on_every_rank(self, loss_finite: bool) -> Tuple[bool, bool]:
        """(every rank's parameters are finite, every rank's last loss was finite), agreed over ranks in one
        collective: a checkpoint is written only when both hold, and every rank decides alike."""
        local = [t.to_local() if hasattr(t, "to_local") else t for t in self.local_state()]
        flags = torch.tensor([float(all(bool(torch.isfinite(t).all()) for t in local if t.numel())),
                              float(loss_finite)])
        if dist.is_initialized() and dist.get_world_size() > 1:
            with paused():
                dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        return bool(flags[0].item()), bool(flags[1].item())

    def apply_hyperparameters(self, cfg) -> None:
        """After a resume: the run's lr, betas and weight decay (a user's optimizer: its file's arguments), not the
        checkpoint's."""
        for group in self.optimizer_param_groups:
            group["lr"] = cfg.lr
            if isinstance(cfg, UserOptimConfig):
                for key, value in cfg.args.items():
                    if key in group and (key != "weight_decay" or group[key]):   # undecayed groups stay at 0
                        group[key] = tuple(value) if isinstance(value, list) else value
                continue
            if "betas" in group:
                group["betas"] = (cfg.beta1, cfg.beta2)
            if group.get("weight_decay"):   # the decayed group (matrices); norms and biases stay at 0
                group["weight_decay"] = cfg.weight_decay

    @abstractmethod
    def save_checkpoint(self, directory: Path) -> None:
        """Write model + optimizer (+ loss scaler) state under `directory` (collective where sharded)."""

    @abstractmethod
    def load_checkpoint(self, directory: Path) -> None:
        """Restore what save_checkpoint wrote."""

    def missing_for(self, directory: Path, rank: int) -> Optional[str]:
        """A file this rank's load will read that is not there, named before any rank loads (a load that fails
        on one rank alone would leave the others in the library's collectives). Default: nothing to check."""
        return None

    def close(self) -> None:
        """Undo what the strategy installed (collective counters). Default: nothing to undo."""
        return


def rebalance(mixtures: List[torch.nn.Module], mesh) -> None:
    """Each bias-balanced mixture's step load summed over the data-parallel ranks (the tp ranks of a group see the
    same tokens; pipeline stages hold other layers), then its bias moved (model/moe.py)."""
    loads = torch.stack([m.step_load for m in mixtures])
    for dim in ("dp_shard", "dp_replicate"):
        if mesh is not None and mesh[dim].size() > 1:
            dist.all_reduce(loads, group=mesh[dim].get_group())
    for m, load in zip(mixtures, loads):
        m.rebalance(load)


class TorchStrategy(Strategy):
    """none/ddp/fsdp2: a torch optimizer over float32 parameters, autocast for bf16/fp16/fp8, and torch's
    GradScaler for fp16. Subclasses wrap the model and say how gradients are reduced."""

    grad_reduce_dtype: Optional[torch.dtype] = torch.float32   # None: no reduction (one process)

    def __init__(self, model, train: TrainConfig, optim_cfg: OptimConfig, precision: Precision, device: torch.device,
                 layout: Layout, mesh):
        self.model, self.train, self.precision, self.device = model, train, precision, device
        self.layout, self.mesh = layout, mesh
        self.optimizer = optim.build(model.parameters(), optim_cfg)
        self.optimizer_record = optim.describe(self.optimizer)
        self.scaler = precision.grad_scaler()
        self.comm = CommCounter()
        self.counter = CollectiveCounter(self.comm, group_names(mesh), world_dim(layout), exchanges(mesh)).install() \
            if mesh is not None else None
        # DTensor parameters (tensor parallelism, FSDP2's shards) or a pipeline's stages: each rank writes its own
        # (DCP), not rank 0 alone
        self.sharded = layout.pp > 1 or any(is_dtensor(p) for p in model.parameters())
        self.measured_state: Dict[str, int] = {}
        # mixtures balanced by a bias (model/moe.py): moved after each optimizer step
        self.balanced = [m for m in mixtures_of(model) if getattr(getattr(m, "cfg", None), "balance", "") == "bias"]
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)
        self.numerics = precision.record(torch.float32, torch.float32, self.grad_reduce_dtype,
                                         "torch" if self.scaler else "none")

    def autocast(self):
        return self._with_loss_context(self.precision.autocast())

    def backward(self, loss: torch.Tensor) -> None:
        with self._with_loss_context(contextlib.nullcontext()):
            (self.scaler.scale(loss) if self.scaler else loss).backward()

    def _with_loss_context(self, inner):
        """`inner`, inside the model's loss context when it has one (a vocab-parallel loss: parallel/tp.py)."""
        made = getattr(self.model, "loss_context", None)
        if made is None:
            return inner
        stack = contextlib.ExitStack()
        stack.enter_context(made())
        stack.enter_context(inner)
        return stack

    def clip(self) -> torch.Tensor:
        """Total gradient norm (clipped when train.max_grad_norm > 0). Inf/NaN means an overflow. The norm is taken
        per mesh (optim.by_mesh: a user's tp_plan leaves some layers whole, and FSDP2 then shards those over
        dp_shard and the split ones over dp_shard x tp), each reduced over its own mesh, then combined (and over
        a pipeline's stages)."""
        max_norm = self.train.max_grad_norm or math.inf
        groups = by_mesh([p for p in self.model.parameters() if p.grad is not None])
        if len(groups) == 1 and self.layout.pp == 1:   # one mesh: torch's clip as it is
            norm = torch.nn.utils.clip_grad_norm_(groups[0], max_norm)
            return norm.full_tensor() if is_dtensor(norm) else norm   # sharded gradients: the norm over all
        norms = [torch.nn.utils.get_total_norm([p.grad for p in group]) for group in groups]
        total = torch.stack([n.full_tensor() if is_dtensor(n) else n for n in norms]).norm()
        if self.layout.pp > 1:   # every stage's gradients: one norm over the pipeline
            total = pp_norm(total, self.mesh)
        for group in groups:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    def step(self, measure_state: bool = False) -> torch.Tensor:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        norm = self.clip()
        if self.scaler is None:
            self.optimizer.step()
        else:   # skipped exactly when a gradient is inf/NaN; then the scale updates
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self._skipped += (~torch.isfinite(norm)).long()
        if measure_state:
            self.measured_state = self.state_bytes()
        self.optimizer.zero_grad(set_to_none=True)
        if self.balanced:
            rebalance(self.balanced, self.mesh)
        return norm

    def loss_scale(self) -> Optional[float]:
        return self.scaler.get_scale() if self.scaler is not None else None

    def local_state(self):
        return [p.detach() for p in self.model.parameters()]

    @property
    def optimizer_param_groups(self):
        return self.optimizer.param_groups

    def skipped_steps(self) -> int:
        return int(self._skipped.item())

    def state_bytes(self) -> Dict[str, int]:
        params = list(self.model.parameters())
        return {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
                "optimizer": optimizer_state_bytes(self.optimizer)}

    @property
    def module(self):
        """The model without its data-parallel wrapper."""
        return getattr(self.model, "module", self.model)

    def save_checkpoint(self, directory: Path) -> None:
        """Replicated state: rank 0 writes one file of tensors and plain values (loadable weights_only). Sharded
        state (DTensors): each rank writes its own shards (torch.distributed.checkpoint), no gather on rank 0."""
        if self.sharded:   # (DCP's import, 0.25 s, paid by the runs that shard only)
            from ablate.parallel import sharded_io

            sharded_io.save(self.model, self.optimizer, directory / "dcp")
            return
        if not dist.is_initialized() or dist.get_rank() == 0:
            torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "scaler": self.scaler.state_dict() if self.scaler else {}},
                       directory / "model_optimizer.pt")

    def load_checkpoint(self, directory: Path) -> None:
        if self.sharded:
            from ablate.parallel import sharded_io

            sharded_io.load(self.model, self.optimizer, directory / "dcp")
            return
        state = torch.load(directory / "model_optimizer.pt", map_location=self.device, weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def close(self) -> None:
        if self.counter is not None:
            self.counter.uninstall()
