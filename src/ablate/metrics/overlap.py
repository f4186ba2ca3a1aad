"""Exposed communication and data wait, measured from a profiler trace (Chrome trace JSON).

One definition (README, summary notes), per profiled step (`ProfilerStep#N` window), in seconds:
- step     = the `ProfilerStep#N` window; on a GPU Kineto writes it twice (the host's `user_annotation`,
             which runs ahead of the device, and the device's `gpu_user_annotation`): the device's is the
             step, since every figure below is read from the device's timeline;
- comm     = union of the collectives' execution: on a CPU the `gloo:*` annotations on gloo's own
             threads (they cover the wait for the peer rank; barriers excluded), on a GPU the NCCL kernels
             only (the host's `nccl:*` annotations time the enqueue, not the transfer);
- compute  = union of the `aten::*` ops on the other threads (CPU), or of the non-NCCL kernels (GPU);
- comm_exposed = |comm - compute|: communication nothing else ran during;
- comm_overlap_frac = |comm ∩ compute| / |comm|;
- data_wait = union of ablate's `ablate:data_wait` annotations (the host blocked on the loader) and, on a
  GPU, host-to-device copies; data_exposed = |data_wait - compute| (on a GPU, compute on other streams);
- idle = step - |comm ∪ compute ∪ data_wait|.
On a CPU the main thread's blocking wait for a collective has no event of its own (a gap), so overlap is
read from the gloo threads against the compute threads. HTA reads only GPU kernel traces; this reads both.
"""
from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

Interval = Tuple[float, float]
COMM_PREFIXES = ("gloo:", "nccl:", "ncclKernel", "ncclDevKernel")
NCCL_KERNELS = ("ncclKernel", "ncclDevKernel")
DATA_NAMES = ("ablate:data_wait",)
FIGURES = ("step_s", "compute_s", "comm_s", "comm_exposed_s", "comm_overlap_frac", "data_wait_s",
           "data_exposed_s", "idle_s")


def union(intervals: Iterable[Interval]) -> List[Interval]:
    merged: List[List[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def intersect(a: List[Interval], b: List[Interval]) -> List[Interval]:
    out, i, j = [], 0, 0
    a, b = union(a), union(b)
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: List[Interval], b: List[Interval]) -> List[Interval]:
    return [(lo, hi) for lo, hi in union(a)
            for lo, hi in _minus((lo, hi), intersect([(lo, hi)], b))]


def _minus(span: Interval, holes: List[Interval]) -> List[Interval]:
    out, cursor = [], span[0]
    for lo, hi in union(holes):
        if lo > cursor:
            out.append((cursor, lo))
        cursor = max(cursor, hi)
    if cursor < span[1]:
        out.append((cursor, span[1]))
    return out


def clip(intervals: Iterable[Interval], window: Interval) -> List[Interval]:
    return [(max(a, window[0]), min(b, window[1])) for a, b in intervals if b > window[0] and a < window[1]]


def load(path: Path) -> Dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _span(e: Dict) -> Interval:
    return float(e["ts"]) / 1e6, (float(e["ts"]) + float(e.get("dur", 0))) / 1e6


def classify(trace: Dict) -> Dict[str, List]:
    """Step windows and the comm / compute / data intervals of a trace, by the module's definition."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    gpu = any(e.get("cat") == "kernel" for e in events)
    if gpu:
        kernels = [e for e in events if e.get("cat") == "kernel"]
        comm_ev = [e for e in kernels if str(e.get("name", "")).startswith(NCCL_KERNELS)]
        compute = [e for e in kernels if not str(e.get("name", "")).startswith(NCCL_KERNELS)]
        copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in str(e.get("name"))]
    else:
        comm_ev = [e for e in events if str(e.get("name", "")).startswith(COMM_PREFIXES)
                   and "barrier" not in e["name"].lower()]
        comm_threads = {(e.get("pid"), e.get("tid")) for e in comm_ev}
        compute = [e for e in events if str(e.get("name", "")).startswith("aten::")
                   and (e.get("pid"), e.get("tid")) not in comm_threads]
        copies = []
    data = [e for e in events if e.get("name") in DATA_NAMES] + copies
    marks = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    on_device = [e for e in marks if e.get("cat") == "gpu_user_annotation"]
    steps = sorted((int(e["name"].split("#")[1]), _span(e)) for e in (on_device if gpu and on_device else marks))
    return {"steps": steps, "comm": [_span(e) for e in comm_ev], "compute": [_span(e) for e in compute],
            "data": [_span(e) for e in data], "gpu": gpu}


def step_figures(parts: Dict[str, List], window: Interval) -> Dict[str, float]:
    comm, compute, data = (union(clip(parts[k], window)) for k in ("comm", "compute", "data"))
    comm_s = length(comm)
    busy = length(comm + compute + data)
    return {"step_s": window[1] - window[0], "compute_s": length(compute), "comm_s": comm_s,
            "comm_exposed_s": length(subtract(comm, compute)),
            "comm_overlap_frac": length(intersect(comm, compute)) / comm_s if comm_s else None,
            "data_wait_s": length(data), "data_exposed_s": length(subtract(data, compute)),
            "idle_s": max(0.0, (window[1] - window[0]) - busy)}


def analyze(trace: Dict) -> Dict[str, object]:
    """Figures per profiled step and their mean (None where a step had no communication)."""
    parts = classify(trace)
    steps = [{"step": n, **step_figures(parts, window)} for n, window in parts["steps"]]
    mean = {}
    for key in FIGURES:
        values = [s[key] for s in steps if s[key] is not None]
        mean[key] = statistics.fmean(values) if values else None
    return {"steps": steps, "mean": mean, "device": "gpu" if parts["gpu"] else "cpu"}
