"""Where a step's time goes: forward+backward and optimizer, timed without a device sync per step.

On CUDA each phase is bracketed by CUDA events that are read only at log intervals; on a CPU the
work is synchronous and perf_counter is exact. Data wait and copy times come from the DeviceFeeder.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Dict

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
