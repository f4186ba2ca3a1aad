"""What a collective costs on this machine in the middle of a step: the lockstep probe, cached per host.

`procs` processes join a gloo group here (spawned, as the run's ranks are started, with the run's threads per
rank) and split into groups of `group` ranks, all working at once as a layout's groups do. Each then repeats
`work, collective` - the work a number of small products (SEGMENTS: a short and a long one), a stand-in for the
compute between two of a step's collectives - and the cost of the collective is that loop's time less the same
loop's without it: the transfer, the wait for the slowest peer and the scheduling of processes that share the
cores, as a rank meets them in a run (a barrier-timed collective alone reads 3-4x cheaper with 2 processes on 2
cores, and after 10 ms of work twice what it costs after 0.5 ms). Per kind (all-reduce, all-gather,
reduce-scatter) at SIZES (the full buffer: metrics/comm.py's convention), the median of 3 loops; a collective of
up to 4 MB costs the line fitted through the sizes up to it (latency + bytes x seconds per byte), a larger one the
line through the larger sizes' own figures (past the caches a byte costs more: 2-3x here at 32 MB). Cached per
host, CPU, torch, processes, group size and threads (ABLATE_CACHE_DIR, else ~/.cache/ablate, `collectives.json`)
with when it was measured: the next prediction reuses it; `ablate.sweeps --measure-peak` drops this host's (or
delete the file) to measure again.
"""
from __future__ import annotations

import os
import socket
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ablate import usable_cores, user_cache_dir
from ablate.metrics.counting import paused
from ablate.metrics.host import cpu_model
from ablate.metrics.peak import forget_host, locked, read_entries, write_entries
from ablate.predict.network import along

SMALL = (1 << 12, 1 << 16, 1 << 18, 1 << 20, 1 << 22)   # bytes: 4 KB to 4 MB, a small model's buckets and blocks
LARGE = (1 << 24, 1 << 25)   # 16 and 32 MB: a larger model's calls (model=small's FSDP2 gathers: 40 MB), past L3
SIZES = SMALL + LARGE
LARGE_REPS = 3   # loops of a large call (tens of ms each, little noise beside it)
WORK_N = 128
# (products of the work between two collectives, loops): ~0.5, ~2.5 and ~10 ms here; a collective's cost grows
# with the compute before it (the slowest peer's lag: 1 ms after 0.5 ms of work, 2 ms after 2.5 ms or 10 ms, two
# processes on 2 cores), up to about a scheduler's time slice
SEGMENTS = ((20, 20), (100, 10), (400, 6))
KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def key(procs: int, group: int) -> str:
    threads = max(1, usable_cores() // procs)
    return (f"{socket.gethostname()}|{cpu_model()}|torch={torch.__version__}|procs={procs}|group={group}"
            f"|threads={threads}|sizes={SIZES[-1] >> 20}MB")


def _loop(call, work, reps: int) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        work()
        call()
    return (time.perf_counter() - t0) / reps


def _probe(rank: int, procs: int, group_size: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, usable_cores() // procs))
    dist.init_process_group("gloo", rank=rank, world_size=procs)
    costs = probe_groups(rank, procs, group_size)
    if rank == 0:
        out.put(costs)
    dist.destroy_process_group()


def probe_groups(rank: int, procs: int, group_size: int) -> List[Dict[str, object]]:
    """Each segment's costs, measured by `procs` processes of a joined gloo group split into groups of
    `group_size`: every process calls it (new_group is collective)."""
    groups = [dist.new_group(list(range(g, g + group_size))) for g in range(0, procs, group_size)]
    group = groups[rank // group_size]
    a = torch.randn(WORK_N, WORK_N)
    return [_segment(a, products, reps, group, group_size) for products, reps in SEGMENTS]


def _segment(a, products: int, reps: int, group, group_size: int) -> Dict[str, object]:
    """{work_s, kind: [[bytes, seconds], ...]}: each collective's cost after `products` products of work (called
    when the work is done, as a step waits on the collective its next op needs)."""
    def work():
        for _ in range(products):
            a @ a

    base = statistics.median(_loop(lambda: None, work, reps) for _ in range(3))
    costs: Dict[str, object] = {"work_s": base, **{kind: [] for kind in KINDS}}
    for nbytes in SIZES:
        full = torch.randn(max(group_size, nbytes // 4 // group_size * group_size))
        part = full[:full.numel() // group_size].clone()
        calls = {"all_reduce": lambda f=full: dist.all_reduce(f, group=group),
                 "all_gather": lambda f=full, p=part: dist.all_gather_single(f, p, group=group),
                 "reduce_scatter": lambda f=full, p=part: dist.reduce_scatter_single(p, f, group=group)}
        loops = reps if nbytes <= SMALL[-1] else min(reps, LARGE_REPS)
        for kind, call in calls.items():
            spent = statistics.median(_loop(call, work, loops) for _ in range(3)) - base   # (per loop)
            costs[kind].append([nbytes, max(0.0, spent)])
    return costs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def entry(costs, started: float, procs: int, group: int, where: str) -> Dict[str, object]:
    return {"costs": costs, "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "how": f"{procs} gloo processes ({where}) in groups of {group}, short and long work then a collective, "
                   f"less the work alone, median of 3, {time.perf_counter() - started:.1f} s",
            "load_1min": os.getloadavg()[0]}


def measure(procs: int, group: int) -> Dict[str, object]:
    out = mp.get_context("spawn").SimpleQueue()
    started = time.perf_counter()
    mp.start_processes(_probe, args=(procs, group, free_port(), out), nprocs=procs, start_method="spawn")
    return entry(out.get(), started, procs, group, "spawned")


def cache_path(cache: Optional[str]) -> Path:
    return Path(cache) if cache else user_cache_dir() / "collectives.json"


def table(procs: int, groups: List[int], cache: Optional[str] = None) -> Dict[int, Dict[str, object]]:
    """{group size: entry} for every group size a step's collectives use among `procs` processes here, from the
    cache or measured now (and cached)."""
    path = cache_path(cache)
    out = {}
    with locked(path):
        entries = read_entries(path)
        for group in groups:
            k = key(procs, group)
            if k not in entries:
                entries[k] = measure(procs, group)
                write_entries(path, entries)
            out[group] = entries[k]
    return out


def table_in_run(procs: int, groups: List[int], rank: int, cache: Optional[str] = None) -> Dict[int, Dict]:
    """table() for a run's own ranks, their gloo group joined (every rank calls it, before the run's first step): a
    group size this host has no probe of is probed by the ranks themselves, the run's processes being the probe's.
    Rank 0's answer; the others' is empty. Rank 0 alone reads and writes the cache."""
    if not groups:   # (every rank's step makes the same collectives: all return here or none)
        return {}
    path = cache_path(cache)
    entries = {}
    if rank == 0:
        with locked(path):
            entries = read_entries(path)
    missing = [[g for g in groups if key(procs, g) not in entries]]
    with paused():   # ablate's own collectives, never counted as the strategy's
        dist.broadcast_object_list(missing, src=0)
        fresh = {}
        for group in missing[0]:
            started = time.perf_counter()
            fresh[key(procs, group)] = entry(probe_groups(rank, procs, group), started, procs, group, "the run's")
    if rank != 0:
        return {}
    if fresh:
        with locked(path):
            entries = {**read_entries(path), **fresh}
            write_entries(path, entries)
    return {group: entries[key(procs, group)] for group in groups}


def forget_this_host(cache: Optional[str] = None) -> int:
    """Drop this host's probes (`ablate.sweeps --measure-peak`): the next prediction measures again. Returns how many
    were dropped."""
    return forget_host(cache_path(cache))


def cost(tables: Dict[int, Dict[str, object]], kind: str, nbytes: float, group: int, segment_s: float) -> float:
    """Seconds one collective costs after `segment_s` of compute: each probed segment's figure for its size,
    interpolated linearly between the segments' work (clamped to the shortest and the longest)."""
    segments = tables[group]["costs"]
    return along([(c["work_s"], by_size(c[kind], nbytes)) for c in segments], segment_s)


def by_size(points: List[List[float]], nbytes: float) -> float:
    """Up to the largest small size: latency + bytes x seconds per byte (Hockney's alpha-beta model of a
    collective), the two fitted by least squares to the small sizes (one noisy size moves it little: the probe's
    figures are not monotone there). Beyond it, the line through the larger sizes' figures, from the fitted line's
    at the largest small size, and on past the largest with its last piece's slope."""
    latency, per_byte = small_line(points)
    large = sorted(p for p in points if p[0] > SMALL[-1])
    if nbytes <= SMALL[-1] or not large:
        return latency + per_byte * nbytes
    curve = [(SMALL[-1], latency + per_byte * SMALL[-1]), *((b, s) for b, s in large)]
    (x0, y0), (x1, y1) = next(((a, b) for a, b in zip(curve, curve[1:]) if nbytes <= b[0]), curve[-2:])
    return y0 + (nbytes - x0) / (x1 - x0) * (y1 - y0)


def small_line(points: List[List[float]]) -> Tuple[float, float]:
    """(latency s, seconds per byte) of the line fitted to the probe's small sizes (all of them, for a probe that
    has no small one): a call's latency, and its cost up to 4 MB."""
    return fit_line([p for p in points if p[0] <= SMALL[-1]] or points)


def fit_line(points: List[List[float]]) -> Tuple[float, float]:
    """(latency s, seconds per byte) fitted by least squares to [[bytes, seconds], ...], neither below zero."""
    sizes, seconds = [p[0] for p in points], [p[1] for p in points]
    mean_x, mean_y = sum(sizes) / len(sizes), sum(seconds) / len(seconds)
    spread = sum((x - mean_x) ** 2 for x in sizes)
    per_byte = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, seconds)) / spread) if spread else 0.0
    return max(0.0, mean_y - per_byte * mean_x), per_byte
