"""Where a step's time goes: forward+backward and optimizer, timed without a device sync per step.

On CUDA each phase is bracketed by CUDA events that are read only at log intervals; on a CPU the
work is synchronous and perf_counter is exact. Data wait and copy times come from the DeviceFeeder.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Dict, List, Optional

import torch

from ablate.metrics.collectors import BuiltIn, Span


class PhaseClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._pending = []                     # (phase, start event, end event) not yet read
        self._totals: Dict[str, float] = defaultdict(float)
        self._start = None

    def begin(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def end(self, phase: str) -> None:
        if self.cuda:
            stop = torch.cuda.Event(enable_timing=True)
            stop.record()
            self._pending.append((phase, self._start, stop))
        else:
            self._totals[phase] += time.perf_counter() - self._start

    def take(self) -> Dict[str, float]:
        """Seconds per phase since the last call (the caller has synchronised the device)."""
        for phase, start, stop in self._pending:
            self._totals[phase] += start.elapsed_time(stop) / 1000.0
        self._pending.clear()
        totals, self._totals = dict(self._totals), defaultdict(float)
        return totals


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimes:
    """Each steady step's duration, from its first micro-batch to the end of its optimizer step: what lies
    between steps (log lines, checkpoints) is not in it. CUDA events are read only at sync points."""

    def __init__(self, device: torch.device, durations: Optional[List[List[float]]] = None):
        self.cuda = device.type == "cuda"
        self.durations: List[List[float]] = durations if durations is not None else []   # [step, seconds]
        self._pending: list = []
        self._begun = None

    def begin(self, step: int) -> None:
        self._begun = (step, self._stamp())

    def end(self) -> None:
        if self._begun is None:
            return
        (step, start), stop = self._begun, self._stamp()
        self._begun = None
        if self.cuda:
            self._pending.append((step, start, stop))
        else:
            self.durations.append([step, stop - start])

    def take(self) -> List[List[float]]:
        """Every step so far (the caller has synchronised the device)."""
        for step, start, stop in self._pending:
            self.durations.append([step, start.elapsed_time(stop) / 1000.0])
        self._pending.clear()
        return self.durations

    def _stamp(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event


class Phases(BuiltIn):
    """Seconds per step in forward+backward and in the optimizer step (the loop brackets them with `clock`)."""
    NAMES = ("fwd_bwd", "optimizer")

    def __init__(self, device: torch.device):
        super().__init__()
        self.clock = PhaseClock(device)
        self.totals = {name: 0.0 for name in self.NAMES}

    def mark(self) -> None:
        self.clock.take()   # what ran before the interval is not in it

    def interval(self, span: Span) -> Dict[str, float]:
        taken = self.clock.take()
        for name in self.NAMES:
            self.totals[name] += taken.get(name, 0.0)
        return self._per_step(span, taken)

    def summary(self, span: Span) -> Dict[str, float]:
        return self._per_step(span, self.totals)

    def _per_step(self, span: Span, seconds: Dict[str, float]) -> Dict[str, float]:
        return {f"time/{name}_s": seconds.get(name, 0.0) / max(span.steps, 1) for name in self.NAMES}


class DataWait(BuiltIn):
    """The time the step waited for its batch and copied it to the device (the DeviceFeeder's clocks), wall-clock."""

    def __init__(self, feeder):
        super().__init__()
        self.feeder = feeder
        self.totals = dict(wait=0.0, copy=0.0)

    def mark(self) -> None:
        self._wait0, self._copy0 = self.feeder.wait_s, self.feeder.copy_s

    def interval(self, span: Span) -> Dict[str, float]:
        wait, copy = self.feeder.wait_s - self._wait0, self.feeder.copy_s - self._copy0
        self.totals["wait"] += wait
        self.totals["copy"] += copy
        return self._figures(span, wait, copy)

    def summary(self, span: Span) -> Dict[str, float]:
        return self._figures(span, self.totals["wait"], self.totals["copy"])

    @staticmethod
    def _figures(span: Span, wait: float, copy: float) -> Dict[str, float]:
        return {"data_wait_frac": wait / span.seconds if span.seconds else None,
                "time/data_wait_s": wait / max(span.steps, 1),
                "time/h2d_copy_s": copy / max(span.steps, 1)}
