"""The strategy interface and the pieces every strategy shares (optimizer, clipping, state bytes)."""
from __future__ import annotations

import contextlib
import math
from pathlib import Path
from dataclasses import dataclass
from typing import Dict, Iterable

import torch
import torch.distributed as dist

from ablate.config import TrainConfig


@dataclass
class CommCounter:
    """Collectives this rank issued for the data-parallel reduction, counted as they run."""
    bytes: int = 0
    calls: int = 0

    def add(self, nbytes: int, calls: int = 1) -> None:
        self.bytes += int(nbytes)
        self.calls += calls


def make_adamw(params: Iterable[torch.nn.Parameter], train: TrainConfig):
    """AdamW, decaying matrices only; fused kernel where this torch has one for the device."""
    params = [p for p in params if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": train.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=train.lr, betas=(0.9, 0.95), fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, lr=train.lr, betas=(0.9, 0.95), foreach=True)


def storages(tensors: Iterable[torch.Tensor]) -> Dict[int, int]:
    """{storage address: bytes} of the memory behind these tensors. Views of one buffer (DeepSpeed's
    flat groups, a parameter and its master copy sharing memory) count once; DTensors count their
    local shard."""
    out: Dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        if local.numel() == 0:
            continue
        storage = local.untyped_storage()
        out[storage.data_ptr()] = storage.nbytes()
    return out


def tensor_bytes(tensors: Iterable[torch.Tensor], exclude: Dict[int, int] = None) -> int:
    exclude = exclude or {}
    return sum(n for ptr, n in storages(tensors).items() if ptr not in exclude)


def optimizer_state_bytes(optimizer) -> int:
    return tensor_bytes(v for state in optimizer.state.values() for v in state.values()
                        if isinstance(v, torch.Tensor))


class Strategy:
    """Local training (the `none` strategy) and the base the data-parallel strategies extend."""

    def __init__(self, model, train: TrainConfig, precision, device: torch.device):
        self.model, self.train, self.precision, self.device = model, train, precision, device
        self.optimizer = make_adamw(model.parameters(), train)
        self.comm = CommCounter()
        self.measured_state: Dict[str, int] = {}

    def micro_step(self, last: bool):
        """Context for one micro-step; `last` is the one whose backward ends the accumulation."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.scale(loss).backward()

    def clip(self) -> torch.Tensor:
        """Total gradient norm (clipped when train.max_grad_norm > 0). Inf/NaN means an overflow."""
        max_norm = self.train.max_grad_norm or math.inf
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def step(self, measure_state: bool = False) -> torch.Tensor:
        """Unscale, clip, step, zero the gradients; returns the gradient norm (a device tensor, no sync).
        `measure_state` records `state_bytes()` while the gradients still exist."""
        self.precision.unscale_(self.optimizer)
        norm = self.clip()
        self.precision.step(self.optimizer)
        if measure_state:
            self.measured_state = self.state_bytes()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def state_bytes(self) -> Dict[str, int]:
        """Bytes of parameters, gradients and optimizer state held by this rank."""
        params = list(self.model.parameters())
        return {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
                "optimizer": optimizer_state_bytes(self.optimizer)}

    @property
    def module(self):
        """The model without its data-parallel wrapper."""
        return getattr(self.model, "module", self.model)

    def save_checkpoint(self, directory: Path) -> None:
        """Replicated state: rank 0 writes one file."""
        if not dist.is_initialized() or dist.get_rank() == 0:
            torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()},
                       directory / "model_optimizer.pt")

    def load_checkpoint(self, directory: Path) -> None:
        state = torch.load(directory / "model_optimizer.pt", map_location=self.device, weights_only=False)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def close(self) -> None:
        pass
