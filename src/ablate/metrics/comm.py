"""The collectives a strategy issued per measured step, as figures: bytes, calls and bytes by mesh dim, and the host
time each step spent before its first collective (a rank late to it holds the others up: steady.py's stalls). The
counting itself (which call is a collective, on which dim, of how many bytes): counting.py.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Deque, Dict, List, Optional

from ablate.config.dims import DECLARED
from ablate.metrics import steady
from ablate.metrics.collectors import BuiltIn, Span
from ablate.metrics.counting import CollectiveCounter, paused_seconds

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


EXCHANGED = tuple(d.name for d in DECLARED if d.traffic == "all_to_all")
EXCHANGE_NOTE = ("the mean over the ranks of what each sent: each sends its own tokens' slots and returns what the "
                 "router gave its experts, so a rank's own figure (per_rank) depends on the routing")


def exchanges_averaged(by_dim: Dict[str, float], per_rank: List[Dict[str, object]]) -> Dict[str, float]:
    """summary.json's comm_bytes_by_dim: rank 0's, but an all-to-all dim's (ep) the mean over the ranks
    (EXCHANGE_NOTE)."""
    out = dict(by_dim)
    for dim in EXCHANGED:
        sent = [r["comm_bytes_by_dim"].get(dim) for r in per_rank if r.get("comm_bytes_by_dim")]
        if dim in out and sent and None not in sent:
            out[dim] = sum(sent) / len(sent)
    return out
