"""A run that cannot fit in memory, refused in one line before any rank allocates: the planned peak per rank
(model/peak.py: the state, the activations and what is held only for a while, measured on fake tensors; the
state alone for a model whose forward fake tensors cannot run), times the ranks on this machine, against what
this process can have (available memory, the memory cgroups above it, v1 or v2, and `ulimit -v`; a GPU's memory
from NVML, without starting CUDA).
`train.skip_memory_check=true` overrides.
"""
from __future__ import annotations

import resource
from pathlib import Path
from typing import Iterator, Optional, Tuple

from ablate import nvml, parallel
from ablate.config import AblateConfig, ConfigError
from ablate.model.facts import ModelFacts, measure
from ablate.model.peak import plan_peak
from ablate.units import fmt

RUNTIME_BYTES = 600e6   # python + torch + the data loader per process, measured here: ~350 MB peak RSS tiny


UNLIMITED = 1 << 60   # cgroup v1 writes "no limit" as a number near 2**63


def _number(path: Path) -> Optional[float]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return float(text) if text.isdigit() and float(text) < UNLIMITED else None


def cgroup_dirs(own: Path = Path("/proc/self/cgroup"), mounts: Path = Path("/sys/fs/cgroup")) \
        -> Iterator[Tuple[Path, str, str]]:
    """The memory cgroups that bound this process, its own and each above it (`own`: /proc/self/cgroup), v1 and v2,
    with their limit and usage files (a cgroup v2 "max", or v1's no-limit number, bounds nothing)."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":   # v2: the unified hierarchy (at the root, or beside v1's in a hybrid setup)
            bases, files = (mounts, mounts / "unified"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            bases, files = (mounts / "memory",), ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        own = Path(path.lstrip("/"))
        for base in bases:
            for group in (own, *own.parents):
                yield base / group, *files


def memory_room(groups: Iterator[Tuple[Path, str, str]] = None) -> Tuple[float, str]:
    """What this process's ranks can still have together, and which limit says so, the tightest of: the machine's
    available memory, and each memory cgroup above the process (its limit less what the group uses)."""
    import psutil

    room = [(float(psutil.virtual_memory().available), "this machine has available")]
    for group, limit_file, usage_file in (cgroup_dirs() if groups is None else groups):
        limit = _number(group / limit_file)
        if limit is not None:
            used = _number(group / usage_file) or 0.0
            room.append((limit - used, f"its memory cgroup ({group}: {fmt('bytes', limit)}, "
                                       f"{fmt('bytes', used)} in use) leaves"))
    return min(room, key=lambda r: r[0])


def available_cpu_bytes() -> float:
    return memory_room()[0]


def address_space_room() -> Optional[float]:
    """What `ulimit -v` (RLIMIT_AS, per process) leaves a rank beyond what this process maps already (a rank starts
    with the same imports); None without a limit."""
    import psutil

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft - psutil.Process().memory_info().vms


def gpu_bytes() -> Optional[float]:
    """Memory of this process's first GPU (torch's device 0, as CUDA_VISIBLE_DEVICES names it) from NVML,
    which creates no CUDA context; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return float(pynvml.nvmlDeviceGetMemoryInfo(nvml.handle(pynvml, 0)).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def need_per_rank(cfg: AblateConfig, facts: ModelFacts, gpu: bool):
    """(bytes one rank needs, what they are, in words): the planned peak (with the GPU allowance on a GPU), or
    the state and the activations where the activations could not be measured."""
    peak = plan_peak(cfg, facts, gpu=gpu)
    if peak is not None:
        return peak.bytes, f"{fmt('bytes', peak.bytes)} planned peak (ablate.plan, at {peak.moment})"
    state = parallel.plan_bytes(facts.numels, cfg, split=facts.split).total
    return state, f"{fmt('bytes', state)} model state (ablate.plan; activations not measurable)"


def over_budget(cfg: AblateConfig, budget_bytes: float) -> Optional[str]:
    """What one rank's planned peak needs, in words, when it is over `budget_bytes` (without the GPU allowance: a
    lower bound, so only what cannot fit is pruned: ablate.tune, ablate.maxbatch); else None."""
    need, what = need_per_rank(cfg, measure(cfg), gpu=False)
    return what if need > budget_bytes else None


def check_memory(cfg: AblateConfig, device_type: str, facts: Optional[ModelFacts] = None) -> None:
    """`facts`: the model measured on fake tensors (model/facts.py), measured here when not given."""
    if cfg.train.skip_memory_check:
        return
    facts = facts or measure(cfg)
    per_rank, what = need_per_rank(cfg, facts, device_type == "cuda")
    ranks = cfg.launcher.nproc_per_node
    if device_type == "cuda":
        have, where, need = gpu_bytes(), "this GPU has", per_rank
    else:
        have, where = memory_room()
        need = ranks * (per_rank + RUNTIME_BYTES)
        mappable = address_space_room()
        if mappable is not None and per_rank + RUNTIME_BYTES > mappable:   # (per process: each rank's own limit)
            need, have, where, ranks = per_rank + RUNTIME_BYTES, mappable, "ulimit -v leaves each process", 1
    if have is None or need <= have:
        return
    raise ConfigError(
        f"model={cfg.model.name}: needs about {fmt('bytes', need)} ({ranks} rank(s) x {what}"
        f"{' + runtime' if device_type != 'cuda' else ''}), {where} {fmt('bytes', have)}; what would fit: a smaller "
        "model, parallel=zero3 or fsdp2 over more ranks, activation checkpointing or a smaller batch "
        "(or train.skip_memory_check=true)")
