"""A run that cannot fit in memory, refused in one line before any rank allocates: the planner's per-rank
state plus the activations its forward keeps (both measured on fake tensors: model/facts.py),
times the ranks on this machine, against what this process can have
(available memory and the cgroup limit; a GPU's memory from NVML, without starting CUDA).
`train.skip_memory_check=true` overrides.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ablate import nvml, parallel
from ablate.config import AblateConfig, ConfigError
from ablate.model.facts import ModelFacts, measure
from ablate.units import fmt

RUNTIME_BYTES = 600e6   # python + torch + the data loader per process, measured here: ~350 MB peak RSS tiny


def available_cpu_bytes() -> float:
    import psutil

    limit = float("inf")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
            limit = min(limit, float(text)) if text.isdigit() else limit
        except OSError:
            continue
    return min(psutil.virtual_memory().available, limit)


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


def check_memory(cfg: AblateConfig, device_type: str, facts: Optional[ModelFacts] = None) -> None:
    """`facts`: the model measured on fake tensors (model/facts.py), measured here when not given."""
    if cfg.train.skip_memory_check:
        return
    facts = facts or measure(cfg)
    state = parallel.plan_bytes(facts.numels, cfg, split=facts.split).total
    activations = facts.activation_bytes or 0.0   # None: not measurable for this model; the state alone
    per_rank = state + activations
    if device_type == "cuda":
        have, where, need = gpu_bytes(), "this GPU has", per_rank
    else:
        have, where = available_cpu_bytes(), "this machine has available"
        need = cfg.launcher.nproc_per_node * (per_rank + RUNTIME_BYTES)
    if have is None or need <= have:
        return
    raise ConfigError(
        f"model={cfg.model.name}: needs about {fmt('bytes', need)} ({cfg.launcher.nproc_per_node} rank(s) x "
        f"{fmt('bytes', state)} model state (ablate.plan) + {fmt('bytes', activations)} activations"
        f"{' + runtime' if device_type != 'cuda' else ''}), {where} {fmt('bytes', have)}; what would fit: a smaller "
        "model, parallel=zero3 or fsdp2 over more ranks, activation checkpointing or a smaller batch "
        "(or train.skip_memory_check=true)")
