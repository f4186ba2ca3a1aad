"""A run that cannot fit in memory, refused in one line before any rank allocates: the planned peak per rank
(model/peak.py: the state, the activations and what is held only for a while, measured on fake tensors; the
state alone for a model whose forward fake tensors cannot run), times the ranks on this machine, against what
this process can have (available memory and the cgroup limit; a GPU's memory from NVML, without starting CUDA).
`train.skip_memory_check=true` overrides.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ablate import nvml, parallel
from ablate.config import AblateConfig, ConfigError
from ablate.model.facts import ModelFacts, measure
from ablate.model.peak import plan_peak
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
    if device_type == "cuda":
        have, where, need = gpu_bytes(), "this GPU has", per_rank
    else:
        have, where = available_cpu_bytes(), "this machine has available"
        need = cfg.launcher.nproc_per_node * (per_rank + RUNTIME_BYTES)
    if have is None or need <= have:
        return
    raise ConfigError(
        f"model={cfg.model.name}: needs about {fmt('bytes', need)} ({cfg.launcher.nproc_per_node} rank(s) x {what}"
        f"{' + runtime' if device_type != 'cuda' else ''}), {where} {fmt('bytes', have)}; what would fit: a smaller "
        "model, parallel=zero3 or fsdp2 over more ranks, activation checkpointing or a smaller batch "
        "(or train.skip_memory_check=true)")
