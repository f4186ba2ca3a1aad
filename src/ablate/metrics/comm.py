"""Counting the collectives a strategy really issues.

- DDP reduces gradients from C++ (its Reducer), so it is counted by a DDP communication hook that
  wraps the default all-reduce hook and adds each bucket's bytes.
- FSDP2 and DeepSpeed call torch.distributed's Python collectives; `CollectiveCounter` wraps those
  functions for the life of the run (installed before DeepSpeed captures references to them).
Payload of one call = the bytes of the full buffer it works on: the tensor of an all-reduce or a
broadcast, the gathered output of an all-gather, the input of a reduce-scatter (the largest tensor
argument in each case). Only the outermost call counts (one collective may call another).
ablate's own bookkeeping collectives run under `paused()` and are not counted.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "all_gather_single", "_all_gather_base", "all_gather",
               "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter",
               "broadcast", "all_reduce_coalesced", "reduce", "all_to_all_single")
_local = threading.local()


def payload_bytes(args, kwargs) -> int:
    best = 0
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            best = max(best, value.numel() * value.element_size())
        elif isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in value):
            best = max(best, sum(t.numel() * t.element_size() for t in value))
    return best


@contextlib.contextmanager
def paused():
    previous = getattr(_local, "depth", 0)
    _local.depth = previous + 1     # looks like an outer call: nothing inside counts
    try:
        yield
    finally:
        _local.depth = previous


class CollectiveCounter:
    """Wraps torch.distributed's collectives; adds each outermost call to `counter`."""

    def __init__(self, counter):
        self.counter = counter
        self.originals = {}

    def _wrap(self, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            depth = getattr(_local, "depth", 0)
            if depth == 0:
                self.counter.add(payload_bytes(args, kwargs))
            _local.depth = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                _local.depth = depth
        counted.__ablate_counted__ = True
        return counted

    def install(self) -> "CollectiveCounter":
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None and not getattr(fn, "__ablate_counted__", False):
                self.originals[name] = fn
                setattr(dist, name, self._wrap(fn))
        return self

    def uninstall(self) -> None:
        for name, fn in self.originals.items():
            setattr(dist, name, fn)
        self.originals.clear()


def counting_allreduce_hook(counter):
    """A DDP comm hook: the default all-reduce, with each bucket's bytes counted."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(process_group, bucket):
        buffer = bucket.buffer()
        counter.add(buffer.numel() * buffer.element_size())
        return allreduce_hook(process_group, bucket)

    return hook


# ablate's own collectives (the logged loss, the per-rank record): paused, so never counted as the strategy's
def all_gather_object(obj, env):
    """ablate's own bookkeeping: not counted as the strategy's communication."""
    if env.world_size == 1:
        return [obj]
    out = [None] * env.world_size
    with paused():
        dist.all_gather_object(out, obj)
    return out


def mean_across_ranks(value, env):
    """The mean of a tensor over ranks (for the logged loss: every rank's batches count)."""
    if env.world_size == 1:
        return value
    value = value.clone()
    with paused():
        dist.all_reduce(value)
    return value / env.world_size
