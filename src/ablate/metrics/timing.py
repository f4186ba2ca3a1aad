"""Where a step's time goes: forward+backward and optimizer, timed without a device sync per step.

On CUDA each phase is bracketed by CUDA events that are read only at log intervals; on a CPU the
work is synchronous and perf_counter is exact. Data wait and copy times come from the DeviceFeeder.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Dict, List, Optional

import torch


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
