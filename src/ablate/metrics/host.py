"""Whether the host was busy with other work while the run measured: a speed figure from a shared machine
is noise as much as effect, and the reader must be able to tell (pyperf warns of an unstable system, Google
Benchmark of CPU scaling).

`host_load` in summary.json: the 1-minute load average at the start and end of the measured steps, and
`other_cpu_frac`: the share of the host's CPU time (all cores, /proc/stat) that was not this run's own (its
ranks' and their data-loader workers' CPU time, psutil) during the measured steps. A run at or above
BUSY_FRAC is marked busy by the report. Linux only; elsewhere the figures are absent with the reason.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import psutil

from ablate.metrics.collectors import BuiltIn

# other processes using a quarter of the host's CPU: enough to move a CPU run's speed well past this
# machine's run-to-run noise (identical runs differ up to 15x under full load)
BUSY_FRAC = 0.25
NOT_LINUX = "no /proc/stat on this system: the host's CPU time cannot be read"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), what a peak FLOP/s and a run's provenance are keyed by."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_cpu_jiffies() -> Optional[Tuple[int, int]]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat's first line."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
    total = sum(fields[:8])                                      # guest time is already in user
    return total - idle, total


def own_cpu_seconds() -> float:
    """This process's CPU time plus its live children's (data-loader workers)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


class HostLoad(BuiltIn):
    """Started when the measured steps start, read when they end (each rank: its own CPU seconds; the trainer
    gathers every rank's `rank_figures` into summary.json's `host_load`)."""

    def __init__(self):
        super().__init__()
        self.start_jiffies: Optional[Tuple[int, int]] = None
        self.start_own = 0.0
        self.load_start: Optional[float] = None

    def start(self) -> None:
        self.start_jiffies, self.start_own = host_cpu_jiffies(), own_cpu_seconds()
        self.load_start = os.getloadavg()[0]

    def rank_figures(self) -> Dict[str, object]:
        """This rank's share of the reading: its own CPU seconds and the host's busy/total seconds."""
        end = host_cpu_jiffies()
        if self.start_jiffies is None or end is None:
            return {"own_cpu_s": None, "host_busy_s": None, "host_total_s": None}
        tick = os.sysconf("SC_CLK_TCK")
        return {"own_cpu_s": own_cpu_seconds() - self.start_own,
                "host_busy_s": (end[0] - self.start_jiffies[0]) / tick,
                "host_total_s": (end[1] - self.start_jiffies[1]) / tick}


def summarize(load_start: Optional[float], ranks: List[Dict[str, object]], host: str) -> Dict[str, object]:
    """host_load of the run from the ranks' readings: the ranks on `host` (rank 0's) share its CPUs, so their
    own CPU time together is the run's; the rest of the busy time is other processes'."""
    here = [r for r in ranks if r.get("host") == host and r.get("host_busy_s") is not None]
    out = {"load_1min_start": load_start, "load_1min_end": os.getloadavg()[0], "other_cpu_frac": None,
           "busy": None, "cpus": psutil.cpu_count(), "reason": None}
    if not here:
        out["reason"] = NOT_LINUX
        return out
    first = here[0]
    own = sum(r["own_cpu_s"] for r in here)
    other = max(0.0, first["host_busy_s"] - own)    # a tick's rounding can make own exceed busy
    out["other_cpu_frac"] = other / first["host_total_s"] if first["host_total_s"] else None
    out["busy"] = out["other_cpu_frac"] is not None and out["other_cpu_frac"] >= BUSY_FRAC
    return out


def busy_frac(window_s: float = 1.0) -> Optional[float]:
    """The share of the host's CPU in use over the next `window_s` seconds (by anything: no run is going)."""
    import time

    first = host_cpu_jiffies()
    time.sleep(window_s)
    second = host_cpu_jiffies()
    if first is None or second is None or second[1] == first[1]:
        return None
    return (second[0] - first[0]) / (second[1] - first[1])


def wait_for_quiet(max_wait_s: float) -> Tuple[float, Optional[float]]:
    """Wait until the host's CPU is under BUSY_FRAC busy, at most `max_wait_s`: (seconds waited, last share)."""
    import time

    started = time.monotonic()
    while True:
        frac = busy_frac()
        waited = time.monotonic() - started
        if frac is None or frac < BUSY_FRAC or waited >= max_wait_s:
            return waited, frac
