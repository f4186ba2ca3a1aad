"""A pipeline's bubble: the fraction of a step each stage's rank waits (parallel.pp > 1), measured, beside what its
schedule is expected to leave.

Measured: `StageClock` times each of the rank's stage actions as the schedule runs them (forward, backward, and
the weight half of a split backward: torch.distributed.pipelining's `forward_one_chunk`, `backward_one_chunk`,
`backward_weight_one_chunk`); the bubble of a step = 1 - (time in those actions) / (the schedule step's wall
time). What is not an action - waiting for a neighbour's activations or gradients, the sends - is the bubble.
On CUDA the actions' times are read from CUDA events at the step's end (no sync per action).

Expected: config/schedules.py (the formulas and their sources).
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import torch

from ablate.config.schedules import SOURCES, expected_of
from ablate.metrics.collectors import BuiltIn, Span


class StageClock:
    """Time in this rank's stage actions during the schedule's steps (see above)."""

    def __init__(self, device):
        self.cuda = getattr(device, "type", "cpu") == "cuda"
        self.busy_s = 0.0       # in actions, this step
        self.wall_s = 0.0       # the schedule step, this step
        self.actions = 0        # actions run, this step
        self._events: List[tuple] = []
        self._t0: Optional[float] = None

    def timed(self, action):
        """`action` (a stage's bound method), timed on each call."""
        def run(*args, **kwargs):
            self.actions += 1
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                try:
                    return action(*args, **kwargs)
                finally:
                    end.record()
                    self._events.append((start, end))
            started = time.perf_counter()
            try:
                return action(*args, **kwargs)
            finally:
                self.busy_s += time.perf_counter() - started
        return run

    def step_begins(self) -> None:
        self.busy_s, self._events, self.actions = 0.0, [], 0
        self._t0 = time.perf_counter()

    def step_ends(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.busy_s = sum(a.elapsed_time(b) for a, b in self._events) / 1e3
        self.wall_s = time.perf_counter() - self._t0


class Bubble(BuiltIn):
    """summary.json's `pp_bubble` (this rank's, measured over the measured steps), `pp_bubble_expected` and the
    schedule's name; per log row, the interval's bubble."""

    def __init__(self, clock: StageClock, parallel):
        super().__init__()
        self.clock = clock
        self.expected = expected_of(parallel)
        self.schedule, self.shape = parallel.pp_schedule, {"pp": parallel.pp, "microbatches": parallel.microbatches,
                                                           "stages_per_rank": parallel.pp_stages_per_rank}
        self.totals = dict(pp_busy_s=0.0, pp_wall_s=0.0, pp_actions=0)
        self._busy = self._wall = 0.0
        self._actions = 0
        self._measured = False

    def step_begins(self, step: int) -> None:   # (called for the measured steps only)
        self._measured = True

    def step_ends(self, grad_norm) -> None:
        if self._measured:
            self._busy += self.clock.busy_s
            self._wall += self.clock.wall_s
            self._actions += self.clock.actions
        self._measured = False

    def mark(self) -> None:
        self._busy = self._wall = 0.0
        self._actions = 0

    def interval(self, span: Span) -> Dict[str, object]:
        self.totals["pp_busy_s"] += self._busy
        self.totals["pp_wall_s"] += self._wall
        self.totals["pp_actions"] += self._actions
        return {"pp_bubble": 1 - self._busy / self._wall if self._wall else None}

    def summary(self, span: Span) -> Dict[str, object]:
        t = self.totals
        return {"pp_bubble": 1 - t["pp_busy_s"] / t["pp_wall_s"] if t["pp_wall_s"] else None,
                "pp_bubble_expected": self.expected,
                "pipeline": {"schedule": self.schedule, **self.shape, "expected_source": SOURCES[self.schedule],
                             **self.per_action()}}

    def per_action(self) -> Dict[str, float]:
        """One action's mean work, and the wait per action beyond the schedule's expected bubble: the schedule's own
        cost per action (its sends, bookkeeping, launches), which dominates the bubble when stages are tiny."""
        t = self.totals
        if not t["pp_actions"] or not t["pp_wall_s"]:
            return {}
        beyond = t["pp_wall_s"] - t["pp_busy_s"] / (1 - self.expected)   # the wall an ideal schedule would not take
        return {"action_s": t["pp_busy_s"] / t["pp_actions"], "overhead_s_per_action": beyond / t["pp_actions"]}


def pipeline_figures(per_rank) -> Dict[str, object]:
    """A pipeline's bubble: the mean of its ranks' (each rank's in per_rank)."""
    bubbles = [r["pp_bubble"] for r in per_rank if r.get("pp_bubble") is not None]
    return {"pp_bubble": sum(bubbles) / len(bubbles)} if bubbles else {}
