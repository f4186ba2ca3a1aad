"""parallel=fsdp2: torch's fully_shard per transformer block plus the root. Parameters, gradients and
optimizer state are sharded across ranks (DTensor); each block's weights are all-gathered before use
and its gradients reduce-scattered after backward.

Numerics as under every torch strategy: float32 shards (the master weights), bf16/fp16 compute under
autocast, gradients reduced in float32. FSDP2's own MixedPrecisionPolicy (low-precision all-gathers) is
deliberately not used, so that precision=bf16 means the same here as under ddp or zero."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

from ablate.config import ConfigError
from ablate.metrics.comm import CollectiveCounter
from ablate.parallel.base import Breakdown, TorchStrategy
from ablate.precision import Precision


class FSDP2(TorchStrategy):
    def __init__(self, model, parallel, train, optim_cfg, precision, device, world_size: int):
        for block in model.blocks.modules:   # the model's repeated blocks (model/contract.py), by rule or named
            fully_shard(block, reshard_after_forward=parallel.reshard_after_forward)
        fully_shard(model, reshard_after_forward=parallel.reshard_after_forward)
        super().__init__(model, train, optim_cfg, precision, device)
        self.counter = CollectiveCounter(self.comm).install()

    @classmethod
    def check(cls, parallel, precision: Precision, has_cuda: bool) -> None:
        if precision.spec.loss_scaling:
            raise ConfigError(f"parallel=fsdp2 with precision={precision.cfg.name}: torch's GradScaler does not "
                              "handle sharded gradients here; valid: precision=fp32, bf16")

    @classmethod
    def plan_bytes(cls, numels, parallel, precision: Precision, world: int) -> Breakdown:
        n = float(sum(numels))
        return Breakdown(4 * n / world, 4 * n / world, 8 * n / world)

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
        with _plain_errors():
            dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(directory / "dcp"))

    def load_checkpoint(self, directory: Path) -> None:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        with _plain_errors():
            dcp.load(state, checkpoint_id=str(directory / "dcp"))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])

    def close(self):
        self.counter.uninstall()


@contextlib.contextmanager
def _plain_errors():
    """DCP gathers every rank's failure into one CheckpointException, which derives from BaseException (so
    `except Exception` misses it) and prints each rank's traceback: raise the root cause instead, the same on
    every rank, an OSError first (a full disk says ENOSPC on the rank that hit it, "unexpected pos" elsewhere)."""
    try:
        yield
    except CheckpointException as e:
        causes = [exc for exc, _trace in (e.failures[r] for r in sorted(e.failures))]
        raise next((c for c in causes if isinstance(c, OSError)), causes[0] if causes else OSError(str(e))) from None
