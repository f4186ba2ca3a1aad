"""Counting the collectives a strategy really issues, by the mesh dim they move on.

- torch.distributed's Python collectives (FSDP2, HSDP, DeepSpeed, DDP's all-reduce comm hook) and the functional
  collectives DTensor calls for tensor parallelism (`torch.distributed._functional_collectives`, the module
  DTensor's placements look each function up in at call time) are wrapped by `CollectiveCounter` for the life
  of the run (installed before DeepSpeed captures references to them), into the strategy's `CommCounter`.
- A pipeline's sends (`isend`, as torch.distributed.pipelining issues them) are counted alike, on `pp`.
- Each call's process group names its mesh dim (`dims`: group name -> pp | dp_replicate | dp_shard | tp, from
  parallel/mesh.py); a call on the default group, or a group the mesh did not make (DeepSpeed's own), counts
  on the dim spanning the world (`default_dim`), else on "other".
Payload of one call = the bytes of the full buffer it works on: the tensor of an all-reduce or a broadcast,
the gathered output of an all-gather, the input of a reduce-scatter (the largest tensor argument or result
in each case); an all-to-all's, what this rank sends (its input: the received share depends on the routing).
Only the outermost call counts (one collective may call another). A group that several dims share (ep and
dp_shard when each rank's experts are sharded over one rank) counts an all-to-all on the dim whose declared traffic
it is (`exchanges`), any other collective on the group's dim.
ablate's own bookkeeping collectives (`all_gather_object`, `mean_across_ranks`, `most_across_ranks`) run under
`paused()` and are not counted. The per-step figures made of these counts: comm.py.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d

COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "all_gather_single", "_all_gather_base", "all_gather",
               "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter",
               "broadcast", "all_reduce_coalesced", "reduce", "all_to_all_single")
# what DTensor (tensor parallelism) calls; the *_autograd and coalesced variants call these or go to C++ alike
FUNCTIONAL = ("all_reduce", "all_gather_single", "all_gather_tensor", "reduce_scatter_single", "reduce_scatter_tensor",
              "all_to_all_single", "broadcast", "all_gather_single_autograd", "reduce_scatter_single_autograd",
              "all_gather_tensor_autograd", "reduce_scatter_tensor_autograd", "all_to_all_single_autograd")
# a pipeline's point-to-point sends (torch.distributed.pipelining: P2POp(dist.isend, ...)); a receive is the sender's
# payload, counted once by the sender. Wrapped where P2POp checks its op, too (c10d's own name: `op is isend`).
P2P = ("isend",)
_local = threading.local()


def payload_bytes(args, kwargs, result=None) -> int:
    best = 0
    for value in (*args, *kwargs.values(), result):
        if isinstance(value, torch.Tensor):
            best = max(best, value.numel() * value.element_size())
        elif isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in value):
            best = max(best, sum(t.numel() * t.element_size() for t in value))
    return best


@contextlib.contextmanager
def paused():
    previous = getattr(_local, "depth", 0)
    _local.depth = previous + 1     # looks like an outer call: nothing inside counts
    started = time.perf_counter()
    try:
        yield
    finally:
        _local.depth = previous
        if previous == 0:   # the time ablate's own collectives took (between steps: who waited on whom)
            _local.paused_s = paused_seconds() + time.perf_counter() - started


def paused_seconds() -> float:
    return getattr(_local, "paused_s", 0.0)


def sent_bytes(fn, args, kwargs) -> int:
    """An all-to-all's input: the functional one's first argument, torch.distributed's second (output, input)."""
    functional = fn.__module__ == funcol.__name__
    tensor = kwargs.get("input") if "input" in kwargs else args[0 if functional else 1]
    return tensor.numel() * tensor.element_size()


def group_name_of(args, kwargs) -> Optional[str]:
    """The name of the process group a collective call names (a ProcessGroup, a (DeviceMesh, dim) pair or a group
    name); None: the default group."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, dist.ProcessGroup):
            return value.group_name
        if isinstance(value, tuple) and len(value) == 2 and hasattr(value[0], "get_group"):
            return value[0].get_group(value[1]).group_name
    group = kwargs.get("group")
    return group if isinstance(group, str) else None


@dataclass
class CommCounter:
    """Collectives this rank issued for the strategy (data- and tensor-parallel), counted as they run, in total and
    by mesh dim; `first_at` is when (host perf_counter) the first one since the meter's step began was entered
    (straggler accounting)."""
    bytes: int = 0
    calls: int = 0
    first_at: Optional[float] = None
    by_dim: Dict[str, int] = field(default_factory=dict)
    # wall-clock entries of this step's collectives, in order, while the meter asks (a list): who arrived last
    arrivals: Optional[List[float]] = None
    # seconds this step spent blocked in collectives (a synchronous call, a Work.wait()), while the meter asks: the
    # rank the others waited on is the one blocked least
    blocked: Optional[float] = None
    # each collective as (the function called, bytes, dim, when: host perf_counter), while someone asks (a list):
    # the step-time model's free step (predict/here.py)
    log: Optional[List[Tuple[str, int, str, float]]] = None

    def entered(self) -> None:
        if self.first_at is None:
            self.first_at = time.perf_counter()

    def arrived(self) -> None:
        """A collective entered (its outermost call, before it waits for the peers)."""
        if self.arrivals is not None:
            self.arrivals.append(time.time())

    def waited(self, seconds: float) -> None:
        if self.blocked is not None:
            self.blocked += seconds

    def add(self, nbytes: int, calls: int = 1, dim: str = "other", called: str = "") -> None:
        self.entered()
        if self.log is not None:
            self.log.append((called, int(nbytes), dim, time.perf_counter()))
        self.bytes += int(nbytes)
        self.calls += calls
        self.by_dim[dim] = self.by_dim.get(dim, 0) + int(nbytes)


class CollectiveCounter:
    """Wraps torch.distributed's and the functional collectives; adds each outermost call to `counter`, on the
    mesh dim its group is (`dims`: group name -> dim)."""

    def __init__(self, counter, dims: Optional[Dict[str, str]] = None, default_dim: Optional[str] = None,
                 exchanges: Optional[Dict[str, str]] = None):
        self.counter = counter
        self.dims, self.exchanges = dims or {}, exchanges or {}
        self.default_dim = default_dim or "other"
        self.originals = []

    def dim_of(self, args, kwargs, called: str = "") -> str:
        name = group_name_of(args, kwargs)
        if name is None:
            return self.default_dim
        if called.startswith("all_to_all") and name in self.exchanges:
            return self.exchanges[name]
        return self.dims.get(name, self.default_dim)

    def _wrap(self, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            depth = getattr(_local, "depth", 0)
            if depth == 0:
                self.counter.entered()   # when (straggler accounting: the work before a step's first collective)
                self.counter.arrived()   # and in order, for a long step's arrivals
            _local.depth = depth + 1
            started = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                _local.depth = depth
                if depth == 0:
                    self.counter.waited(time.perf_counter() - started)
            if depth == 0:
                nbytes = sent_bytes(fn, args, kwargs) if fn.__name__.startswith("all_to_all") else \
                    payload_bytes(args, kwargs, result if isinstance(result, torch.Tensor) else None)
                self.counter.add(nbytes, dim=self.dim_of(args, kwargs, fn.__name__), called=fn.__name__)
            return result
        counted.__ablate_counted__ = True
        return counted

    def _timed_wait(self, wait):
        """Work.wait() (FSDP2's and DeepSpeed's asynchronous collectives are waited on so): its time, blocked."""
        @functools.wraps(wait)
        def timed(work, *args, **kwargs):
            if getattr(_local, "depth", 0):
                return wait(work, *args, **kwargs)
            started = time.perf_counter()
            try:
                return wait(work, *args, **kwargs)
            finally:
                self.counter.waited(time.perf_counter() - started)
        timed.__ablate_counted__ = True
        return timed

    def install(self) -> "CollectiveCounter":
        for module, names in ((dist, COLLECTIVES), (funcol, FUNCTIONAL)):
            for name in names:
                fn = getattr(module, name, None)
                if fn is not None and not getattr(fn, "__ablate_counted__", False):
                    self.originals.append((module, name, fn))
                    setattr(module, name, self._wrap(fn))
        for name in P2P:
            fn = getattr(c10d, name)
            if not getattr(fn, "__ablate_counted__", False):
                counted = self._wrap(fn)
                for module in (dist, c10d):
                    self.originals.append((module, name, getattr(module, name)))
                    setattr(module, name, counted)
        if not getattr(dist.Work.wait, "__ablate_counted__", False):
            self.originals.append((dist.Work, "wait", dist.Work.wait))
            dist.Work.wait = self._timed_wait(dist.Work.wait)
        return self

    def uninstall(self) -> None:
        for module, name, fn in self.originals:
            setattr(module, name, fn)
        self.originals.clear()


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



def most_across_ranks(value: int, env) -> int:
    """The largest of an integer over ranks (a decision every rank must take alike: a run that diverged on one)."""
    if env.world_size == 1:
        return value
    found = torch.tensor([value], dtype=torch.int64, device=env.device)   # (NCCL reduces device tensors only)
    with paused():
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return int(found.item())
