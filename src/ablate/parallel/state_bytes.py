"""The bytes of model state a rank holds (parameters, gradients, optimizer state): predicted per strategy for
`ablate.plan` (`Breakdown`), measured from the memory behind the tensors (`storages`: a buffer counts once)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable

import torch


@dataclass
class Breakdown:
    """Per-rank bytes of model state, as `ablate.plan` predicts it."""
    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


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
