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
in each case). Only the outermost call counts (one collective may call another).
ablate's own bookkeeping collectives run under `paused()` and are not counted.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d

from ablate.metrics import steady
from ablate.metrics.collectors import BuiltIn, Span

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

    def __init__(self, counter, dims: Optional[Dict[str, str]] = None, default_dim: Optional[str] = None):
        self.counter = counter
        self.dims = dims or {}
        self.default_dim = default_dim or "other"
        self.originals = []

    def dim_of(self, args, kwargs) -> str:
        name = group_name_of(args, kwargs)
        return self.dims.get(name, self.default_dim) if name is not None else self.default_dim

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
                self.counter.add(payload_bytes(args, kwargs, result if isinstance(result, torch.Tensor) else None),
                                 dim=self.dim_of(args, kwargs), called=fn.__name__)
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


# a step over LONG_STEP x the recent median keeps its collectives' arrival times (LONG_KEPT steps at most): the
# stall detection (steady.py, x10) compares them across ranks
LONG_STEP, LONG_KEPT = 5.0, 16


class Comm(BuiltIn):
    """The collectives the strategy issued per measured step (bytes, calls, bytes by mesh dim), and the host time
    each step spent before its first one (a rank that is late to it holds the others up: steady.py's stalls)."""

    def __init__(self, counter: CollectiveCounter, layout):
        super().__init__()
        self.counter, self.layout = counter, layout
        self.totals = dict(comm_bytes=0, comm_calls=0, comm_by_dim={})
        self.before_comm: List[tuple] = []   # per measured step: (step, host seconds before its first collective)
        # the long steps' (step, collectives' arrival times, seconds blocked in them, wall clock from, to), at most
        # LONG_KEPT: which rank arrived last, which one the others waited on, which one was stopped then
        self.long_steps: List[tuple] = []
        # long gaps between steps (log points, checkpoints: ablate's own collectives), (step before, seconds,
        # seconds in ablate's own collectives, wall clock from, to), at most LONG_KEPT: a rank stopped there holds
        # the others up there
        self.long_gaps: List[tuple] = []
        self._recent: Deque[float] = deque(maxlen=32)
        self._step, self._host_t0, self._after_long = 0, None, False
        self._ended: Optional[tuple] = None   # (perf_counter, paused seconds, wall) when the last step ended
        self._wall_t0 = 0.0

    def step_begins(self, step: int) -> None:
        if self._ended is not None and self._recent and len(self.long_gaps) < LONG_KEPT:
            gap = time.perf_counter() - self._ended[0]
            if gap > LONG_STEP * statistics.median(self._recent):
                self.long_gaps.append((self._step, gap, paused_seconds() - self._ended[1], self._ended[2],
                                       time.time()))
        self._step = step
        self.counter.first_at = None       # the step's first collective is stamped by the counter
        self.counter.arrivals, self.counter.blocked = [], 0.0
        self._host_t0, self._wall_t0 = time.perf_counter(), time.time()

    def step_ends(self, grad_norm) -> None:
        if self._host_t0 is None:
            return
        now = time.perf_counter()
        self.before_comm.append((self._step, (self.counter.first_at or now) - self._host_t0))
        took, arrivals = now - self._host_t0, self.counter.arrivals
        long = bool(self._recent) and took > LONG_STEP * statistics.median(self._recent)
        # a stall on some rank: when this one reached each collective, in that step and the next (a rank stopped
        # after its last collective holds the others up at their next step's first)
        if arrivals and (long or self._after_long) and len(self.long_steps) < LONG_KEPT:
            self.long_steps.append((self._step, list(arrivals), self.counter.blocked, self._wall_t0, time.time()))
        self._after_long = long
        self._recent.append(took)
        self.counter.arrivals = self.counter.blocked = None
        self._host_t0 = None
        self._ended = (time.perf_counter(), paused_seconds(), time.time())

    def mark(self) -> None:
        self._bytes0, self._calls0 = self.counter.bytes, self.counter.calls
        self._by_dim0 = dict(self.counter.by_dim)

    def interval(self, span: Span) -> Dict[str, float]:
        sent, calls = self.counter.bytes - self._bytes0, self.counter.calls - self._calls0
        self.totals["comm_bytes"] += sent
        self.totals["comm_calls"] += calls
        by_dim = self.totals["comm_by_dim"]
        for dim, n in self.counter.by_dim.items():
            by_dim[dim] = by_dim.get(dim, 0) + n - self._by_dim0.get(dim, 0)
        return {"comm_bytes_per_step": sent / max(span.steps, 1), "comm_calls_per_step": calls / max(span.steps, 1)}

    def summary(self, span: Span) -> Dict[str, object]:
        t = self.totals
        if not span.steps:   # a run stopped inside its warm-up: nothing measured
            return {"comm_bytes_per_step": None, "comm_calls_per_step": None, "comm_bytes_by_dim": {},
                    "compute_before_comm_s": None}
        return {"comm_bytes_per_step": t["comm_bytes"] / span.steps,
                "comm_calls_per_step": t["comm_calls"] / span.steps,
                "comm_bytes_by_dim": {d: t["comm_by_dim"].get(d, 0) / span.steps for d in self.layout.active_dims()},
                "compute_before_comm_s": steady.median_or_none([s for _, s in self.before_comm])}

    def slowest_before_comm(self, count: int = 8) -> List[List[float]]:
        """This rank's longest waits before its first collective, [step, seconds]: who held a stall up."""
        return [list(p) for p in sorted(self.before_comm, key=lambda p: p[1], reverse=True)[:count]]
