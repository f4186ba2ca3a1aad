"""Memory figures and our fragmentation definition.

Fragmentation (no peer logs one, so we define it and log its inputs):
    fragmentation        = 1 - active_bytes.all.peak / reserved_bytes.all.peak
        the share of memory the caching allocator holds from CUDA that live tensors never used in
        the interval (cached free blocks, rounding, blocks split too small to reuse).
    inactive_split_frac  = inactive_split_bytes.all.peak / reserved_bytes.all.peak
        the share sitting in split blocks that are free but cannot serve a larger request: the
        "false OOM" memory of week-4 C5.
Peaks are reset at every log interval, so each figure describes that interval.
On a CPU there is no caching allocator: fragmentation is None, with the reason.
"""
from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Dict, Optional

import torch

from ablate.metrics.collectors import BuiltIn, Span

CUDA_KEYS = ("allocated_bytes.all.peak", "active_bytes.all.peak", "reserved_bytes.all.peak",
             "requested_bytes.all.peak", "inactive_split_bytes.all.peak", "reserved_bytes.all.current",
             "num_alloc_retries", "num_ooms")
NO_CUDA_REASON = "no CUDA device: fragmentation is a property of the CUDA caching allocator"


def fragmentation(stats: Dict[str, int]) -> Dict[str, Optional[float]]:
    """The two ratios above from a torch.cuda.memory_stats() dict; None where reserved is 0."""
    reserved = stats.get("reserved_bytes.all.peak", 0)
    if not reserved:
        return {"fragmentation": None, "inactive_split_frac": None}
    return {"fragmentation": 1.0 - stats.get("active_bytes.all.peak", 0) / reserved,
            "inactive_split_frac": stats.get("inactive_split_bytes.all.peak", 0) / reserved}


def cuda_interval(device: torch.device) -> Dict[str, object]:
    """This interval's CUDA memory figures (then resets the peaks for the next one)."""
    stats = torch.cuda.memory_stats(device)
    out = {f"mem/{k}": stats.get(k, 0) for k in CUDA_KEYS}
    out.update({f"mem/{k}": v for k, v in fragmentation(stats).items()})
    out["mem_peak_bytes"] = stats.get("allocated_bytes.all.peak", 0)
    out["mem_reserved_bytes"] = stats.get("reserved_bytes.all.peak", 0)
    out["fragmentation"] = out["mem/fragmentation"]
    torch.cuda.reset_peak_memory_stats(device)
    return out


STATUS = Path("/proc/self/status")


def _ru_maxrss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024   # KiB on Linux, bytes on macOS


def _vm_hwm_bytes() -> Optional[int]:
    """VmHWM: the high-water mark of this process's own address space (Linux)."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024   # "VmHWM:   13492 kB"
    except OSError:
        pass
    return None


class PeakRss:
    """Peak resident set size of this process. ru_maxrss alone is not it: Linux carries it across execve, so a
    run started by a larger process (a tune driver, a pytest worker) would read its parent's peak (the child of a
    1.5 GB parent reads 1.5 GB; its VmHWM, 13 MB). ru_maxrss is max(the parent's peak, ours): once it grows past
    what was inherited it is ours; until then VmHWM says (/proc, read only while needed: no read per log step on a
    run started from a shell)."""

    def __init__(self):
        self.inherited = _ru_maxrss_bytes()
        own = _vm_hwm_bytes()
        self.ru_is_own = own is None or own >= self.inherited

    def bytes(self) -> int:
        ru = _ru_maxrss_bytes()
        if self.ru_is_own or ru > self.inherited:
            self.ru_is_own = True
            return ru
        return _vm_hwm_bytes() or ru


def cpu_interval(peak_rss: PeakRss) -> Dict[str, object]:
    rss = peak_rss.bytes()
    return {"mem/peak_rss_bytes": rss, "mem_peak_bytes": rss, "mem_reserved_bytes": None, "fragmentation": None}


def interval(device: torch.device, peak_rss: PeakRss) -> Dict[str, object]:
    return cuda_interval(device) if device.type == "cuda" else cpu_interval(peak_rss)


class Memory(BuiltIn):
    """Each log row's memory (its interval's peaks: CUDA's allocator, or the peak RSS on a CPU); the summary's are
    the run's (the max over intervals), with fragmentation and its inputs on CUDA."""

    def __init__(self, device: torch.device, notes: Dict[str, str]):
        super().__init__()
        self.device, self.peak_rss = device, PeakRss()
        self.max: Dict[str, Optional[int]] = {}
        self.last: Dict[str, object] = {}
        if device.type != "cuda":
            notes["fragmentation"] = NO_CUDA_REASON
            notes["mem_reserved_bytes"] = "no CUDA caching allocator on a CPU; mem_peak_bytes is peak RSS"

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)   # peaks of the measured steps only

    def logged(self) -> Dict[str, object]:
        self.last = interval(self.device, self.peak_rss)
        for k, v in self.last.items():   # whole-run peaks: the max over intervals
            if k.endswith(".peak") or k in ("mem_peak_bytes", "mem_reserved_bytes"):
                self.max[k] = max(self.max.get(k) or 0, v or 0) if v is not None else None
        return dict(self.last)

    def summary(self, span: Span) -> Dict[str, object]:
        m = self.max
        out = {"mem_peak_bytes": m.get("mem_peak_bytes"), "mem_reserved_bytes": m.get("mem_reserved_bytes")}
        if self.device.type != "cuda":
            return {**out, "fragmentation": None, "inactive_split_frac": None}
        stats = {k[len("mem/"):]: v for k, v in m.items() if k.startswith("mem/")}
        out.update(fragmentation(stats))
        out.update({f"mem_{k.split('.')[0]}": v for k, v in stats.items()})
        out["mem_num_alloc_retries"] = self.last.get("mem/num_alloc_retries")
        out["mem_num_ooms"] = self.last.get("mem/num_ooms")
        return out
