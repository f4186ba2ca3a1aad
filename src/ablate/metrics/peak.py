"""Peak FLOP/s per device: override > datasheet > measured (a GEMM probe), each kept for the record.

The measured peak is cached per host and hardware and software (host, device, CPU model, dtype, torch
threads, probe size, torch version) in the user cache (ABLATE_CACHE_DIR, else ~/.cache/ablate), so every run
and every sweep on this host divides by the same number until one of those changes or the user asks for a
new measurement (`metrics.measure_peak=true`, `ablate.sweeps --measure-peak`): two arms, or two sweeps, that
each probed their own peak on a shared, noisy machine could differ 2x in MFU for no reason of their own.
Each entry says when and how it was measured, and how loaded the host was then (`load_1min`).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, Optional

import torch
import torch.distributed as dist

from ablate import user_cache_dir
from ablate.metrics import flops as F
from ablate.metrics.counting import paused
from ablate.metrics.host import cpu_model
from ablate.precision import numerics


@contextmanager
def locked(path: Path):
    """An exclusive lock beside `path`: ranks starting together measure once; the others wait and read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def peak_key(device_name: str, dtype: torch.dtype, n: int) -> str:
    """What the measured peak depends on: a new key (other hardware, threads or torch) is a new measurement."""
    return (f"{socket.gethostname()}|{device_name}|{cpu_model()}|{dtype}|threads={torch.get_num_threads()}|n={n}"
            f"|torch={torch.__version__}")


def measured_peak(device: torch.device, device_name: str, dtype: torch.dtype, n: int,
                  cache: Optional[str], measure: bool = False) -> Dict[str, object]:
    """{flops, measured_at, how, cache, reused} for this machine, from the cache or (`measure`, or none cached
    for this key) a fresh probe."""
    path = Path(cache) if cache else user_cache_dir() / "peak_flops.json"
    key = peak_key(device_name, dtype, n)
    with locked(path):
        entries = read_entries(path)
        entry = entries.get(key)
        if entry and not measure:
            return {**entry, "cache": str(path), "reused": True}
        flops, seconds = F.gemm_probe(device, dtype, n)
        entry = {"flops": flops, "measured_unix": time.time(),
                 "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "how": f"median of 10 {n}x{n}x{n} {str(dtype).replace('torch.', '')} matmuls after 3 warm-ups, "
                        f"{torch.get_num_threads()} torch threads, {seconds:.1f} s", "key": key,
                 "load_1min": os.getloadavg()[0]}
        entries[key] = entry
        write_entries(path, entries)
        return {**entry, "cache": str(path), "reused": False}


def read_entries(path: Path) -> Dict[str, object]:
    """A host cache's entries (keyed `host|...`), or none when it is missing or torn; read under `locked(path)`."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_entries(path: Path, entries: Dict[str, object]) -> None:
    """Whole or not at all (a reader under the lock never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    os.replace(tmp, path)


def forget_host(path: Path) -> int:
    """Drop this host's entries from a host cache; returns how many were dropped."""
    with locked(path):
        entries = read_entries(path)
        kept = {k: v for k, v in entries.items() if not k.startswith(f"{socket.gethostname()}|")}
        if len(kept) < len(entries):
            write_entries(path, kept)
        return len(entries) - len(kept)


def forget_this_host(cache: Optional[str] = None) -> int:
    """Drop this host's measured peaks (`ablate.sweeps --measure-peak`): the next run measures again, and the
    runs after it reuse that. Returns how many were dropped."""
    return forget_host(Path(cache) if cache else user_cache_dir() / "peak_flops.json")


def settle(device: torch.device) -> None:
    """Ranks sharing this host's cores meet first, so that the one that measures does it while the others wait on
    the cache's lock, not while they still import and build (4 ranks on 2 cores: a 1-thread probe read 66 GFLOP/s
    where the same thread does 160 alone, every later run's MFU 2.4x high and its machine "off" its calibration)."""
    if device.type == "cpu" and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        with paused():
            dist.barrier()


class Peak:
    """The run's peak FLOP/s per device and where it came from (`source`), with every candidate kept."""

    def __init__(self, cfg, device: torch.device, notes: Dict[str, str], rank: int = 0):
        spec = numerics(cfg.precision.name)
        self.datasheet = self.measured = None
        self.probe: Dict[str, object] = {}
        self.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        if device.type == "cuda":
            self.datasheet = F.datasheet_peak(self.device_name, spec.peak_column)
        if cfg.metrics.gemm_probe:
            n = cfg.metrics.gemm_probe_n or (8192 if device.type == "cuda" else 1024)
            settle(device)
            self.probe = measured_peak(device, self.device_name, spec.probe_dtype, n, cfg.metrics.peak_cache,
                                       measure=cfg.metrics.measure_peak and rank == 0)   # the others read it
            # the probe multiplies in bf16: it is no fp8 peak (an fp8 MFU against it would read ~2x high)
            self.measured = None if spec.fp8_matmuls else self.probe["flops"]
        override = cfg.metrics.peak_tflops * 1e12 if cfg.metrics.peak_tflops else None
        self.value, self.source = next(((v, s) for v, s in ((override, "override"), (self.datasheet, "datasheet"),
                                                           (self.measured, "measured")) if v), (None, None))
        if self.value is None:
            notes["mfu"] = f"no peak FLOP/s for {self.device_name}: no datasheet entry, probe off, no override"
        elif self.source == "measured":
            notes["mfu"] = (f"MFU is relative to this machine's measured {cfg.precision.name} matmul rate "
                            f"(GEMM probe, {self.probe['measured_at']}), not a datasheet peak: "
                            f"{self.device_name} has none")

    def record(self) -> Dict[str, object]:
        return {"peak_flops": self.value, "peak_flops_source": self.source, "peak_flops_datasheet": self.datasheet,
                "peak_flops_measured": self.measured, "peak_flops_probe": self.probe or None}
