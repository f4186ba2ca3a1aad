"""Refusals that protect what is already recorded, and runs that cannot fit: each one line, before work.

- The run directory: empty `hydra.run.dir=` (it would write into the current directory), a directory that
  already holds a run (unless it is being resumed), one another live run is writing into (a lock), one
  that cannot be written (read-only, full).
- Memory: the planner's per-rank state plus an activation estimate, times the ranks on this machine,
  against what this process can have (available memory and the cgroup limit; a GPU's memory from NVML,
  without starting CUDA). `train.skip_memory_check=true` overrides.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path
from typing import Optional

from ablate import nvml, parallel
from ablate.config import AblateConfig, ConfigError
from ablate.model import param_numels
from ablate.units import fmt

RUN_FILES = ("summary.json", "metrics.jsonl")
_LOCKS = {}   # run dir -> open lock file, held until the run ends (release) or the process exits


def check_run_dir_override(overrides) -> None:
    for o in overrides:
        if o.startswith("hydra.run.dir=") and not o.split("=", 1)[1].strip():
            raise ConfigError("hydra.run.dir is empty: it would write into the current directory; give a directory "
                              "(the default is runs/<date>/<time>)")


def holds_a_run(run_dir: Path) -> bool:
    return any((run_dir / f).exists() for f in RUN_FILES)


def check_fresh(run_dir: Path, resume: Optional[str]) -> None:
    """A directory that already holds a run is continued with train.resume, never overwritten."""
    resuming_here = resume and Path(resume).resolve() in (run_dir.resolve(), (run_dir / "checkpoint").resolve())
    if holds_a_run(run_dir) and not resuming_here:
        found = ", ".join(f for f in RUN_FILES if (run_dir / f).exists())
        raise ConfigError(f"hydra.run.dir={run_dir}: already holds a run ({found}); choose another directory, "
                          f"or continue it with train.resume={run_dir}")


def check_writable(run_dir: Path, need_bytes: int = 1 << 20) -> None:
    """The nearest existing folder of run_dir takes a file and has room."""
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise ConfigError(f"hydra.run.dir={run_dir}: {probe} is not writable (read-only or no permission)")
    if shutil.disk_usage(probe).free < need_bytes:
        raise ConfigError(f"hydra.run.dir={run_dir}: no space left on {probe}")


LOCK_FILE = ".ablate.lock"


def _held(run_dir: Path) -> ConfigError:
    return ConfigError(f"hydra.run.dir={run_dir}: another run is writing into it; choose another directory")


def check_unlocked(run_dir: Path) -> None:
    """Refuse, before anything is written into it, a directory a live run holds (`lock` takes it later)."""
    try:
        handle = open(run_dir / LOCK_FILE)
    except OSError:
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise _held(run_dir) from None
        fcntl.flock(handle, fcntl.LOCK_UN)


def lock(run_dir: Path) -> None:
    """One live run per directory: a second one is refused while the first holds the lock."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        handle = open(run_dir / LOCK_FILE, "a+")
    except OSError as e:
        reason = os.strerror(e.errno or errno.EIO)
        raise ConfigError(f"hydra.run.dir={run_dir}: cannot be written ({reason})") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise _held(run_dir) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    _LOCKS[run_dir] = handle


def release(run_dir: Path) -> None:
    handle = _LOCKS.pop(run_dir, None)
    if handle is not None:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


# -- memory ---------------------------------------------------------------------------------------
RUNTIME_BYTES = 600e6   # python + torch + the data loader per process, measured here: ~350 MB peak RSS tiny


def activation_bytes(cfg: AblateConfig) -> float:
    """A rough upper estimate of one rank's activations for one micro-step: per layer ~(16 d + 6 f) values
    per token (inputs of each matmul, norms, SwiGLU), plus the logits and their gradient; with activation
    checkpointing only each block's input and one block at a time. 4 bytes a value (fp32 autocast inputs)."""
    m, t = cfg.model, cfg.train
    tokens = t.batch_size * t.seq_len
    per_layer = tokens * (16 * m.dim + 6 * m.ffn_hidden) * 4
    layers = (m.n_layers * tokens * m.dim * 4 + per_layer) if m.activation_checkpointing else m.n_layers * per_layer
    return layers + 2 * tokens * m.vocab_size * 4


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


def check_memory(cfg: AblateConfig, device_type: str) -> None:
    if cfg.train.skip_memory_check:
        return
    state = parallel.plan_bytes(param_numels(cfg), cfg).total
    per_rank = state + activation_bytes(cfg)
    if device_type == "cuda":
        have, where, need = gpu_bytes(), "this GPU has", per_rank
    else:
        have, where = available_cpu_bytes(), "this machine has available"
        need = cfg.launcher.nproc_per_node * (per_rank + RUNTIME_BYTES)
    if have is None or need <= have:
        return
    raise ConfigError(
        f"model={cfg.model.name}: needs about {fmt('bytes', need)} ({cfg.launcher.nproc_per_node} rank(s) x "
        f"{fmt('bytes', state)} model state (ablate.plan) + {fmt('bytes', activation_bytes(cfg))} activations"
        f"{' + runtime' if device_type != 'cuda' else ''}), {where} {fmt('bytes', have)}; what would fit: a smaller "
        "model, parallel=zero3 or fsdp2 over more ranks, activation checkpointing or a smaller batch "
        "(or train.skip_memory_check=true)")
