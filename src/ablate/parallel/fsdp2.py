"""parallel=fsdp2: torch's fully_shard per transformer block plus the root. Parameters, gradients and
optimizer state are sharded across ranks (DTensor); each block's weights are all-gathered before use
and its gradients reduce-scattered after backward. The precision group sets the mixed-precision policy."""
from __future__ import annotations

import contextlib

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ablate.metrics.comm import CollectiveCounter
from ablate.parallel.base import Strategy


class FSDP2(Strategy):
    def __init__(self, model, train, precision, device, reshard_after_forward: bool):
        policy = MixedPrecisionPolicy(param_dtype=precision.dtype, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)
        super().__init__(model, train, precision, device)
        self.counter = CollectiveCounter(self.comm).install()

    def micro_step(self, last: bool):
        # skip the reduce-scatter on all but the last micro-step (FSDP2's no_sync equivalent)
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def clip(self) -> torch.Tensor:
        norm = super().clip()
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def save_checkpoint(self, directory: Path) -> None:
        """Each rank writes its own shards (torch.distributed.checkpoint): no gather on rank 0."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(directory / "dcp"))

    def load_checkpoint(self, directory: Path) -> None:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=str(directory / "dcp"))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])

    def close(self):
        self.counter.uninstall()
