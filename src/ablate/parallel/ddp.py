"""parallel=ddp|ddp_sync: DistributedDataParallel. With `no_sync` (ddp), the first grad_accum - 1
micro-steps skip the all-reduce (`model.no_sync()`), so gradients are reduced once per optimizer step
(week-4 C3); ddp_sync reduces on every micro-step."""
from __future__ import annotations

import contextlib
import inspect

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ablate.parallel.base import TorchStrategy
from ablate.parallel.state_bytes import Breakdown
from ablate.precision import Precision


def buffer_sync(model) -> dict:
    """DDP's buffer broadcast, on for a model whose state has buffers (BatchNorm's running statistics: rank 0's
    are the model's, as torch's default has it), off when every buffer is a constant outside the state (the
    RoPE tables, identical on every rank: broadcasting them each forward is waste)."""
    state = set(model.state_dict().keys())
    real = any(name in state for name, _ in model.named_buffers())
    if real:
        return {}
    key = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(
        DistributedDataParallel).parameters else "broadcast_buffers"
    return {key: False}


def allreduce_mean(state, bucket):   # (no annotation: DDP compares it with the type, not a string)
    """torch's default all-reduce hook (default_hooks.allreduce_hook: the bucket divided by the world, summed over
    it, in Python so that the collective counter sees each bucket), its future giving the bucket itself rather than
    the collective's result (the same tensor, reduced in place): so it also runs on torch's fake process group,
    whose futures carry nothing (the step-time model runs a rank's step on one, predict/here.py)."""
    group = state if state is not None else dist.group.WORLD
    tensor = bucket.buffer().div_(group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda _: tensor)


class DDP(TorchStrategy):
    """Replicated float32 parameters; float32 gradients all-reduced in buckets over the mesh's `dp_replicate` dim
    (torch's default all-reduce hook, in Python so that the collective counter sees each bucket)."""

    def __init__(self, model, parallel, train, optim_cfg, precision, device, layout, mesh):
        buckets = {"bucket_cap_mb": parallel.bucket_cap_mb} if parallel.bucket_cap_mb else {}
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                      process_group=mesh.get_group("dp_replicate") if mesh is not None else None,
                                      **buffer_sync(model), **buckets)
        super().__init__(ddp, train, optim_cfg, precision, device, layout, mesh)
        self.no_sync = parallel.no_sync
        ddp.register_comm_hook(None, allreduce_mean)

    def micro_step(self, last: bool):
        if self.no_sync and not last:
            return self.model.no_sync()     # accumulate locally; the last micro-step reduces the sum
        return contextlib.nullcontext()

    @classmethod
    def plan_bytes(cls, numels, parallel, precision: Precision, layout) -> Breakdown:
        n = float(sum(numels))
        return Breakdown(4 * n, 4 * n, 8 * n)     # everything replicated
