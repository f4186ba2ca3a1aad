"""`python -m ablate.tune`: the fastest configuration within a memory budget, searched with Optuna, the winner
confirmed against the runner-up (__main__.py runs it; this module: the space, the pruning, a trial).

A trial is `python -m ablate <overrides>` in a fresh process (allocator, NCCL and CUDA settings are per
process) with the steady-step figures; its objective is a summary.json figure (`metrics.objective`).
Before a trial runs, the planner and the memory guard (model state + activations, measured on the meta
device) prune a configuration that cannot fit `--mem-budget-gb`: recorded as pruned with the reason, no
device time spent on it. A trial that runs out of memory is recorded as `oom`, not as a failure.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ablate import units
from ablate.config import ConfigError
from ablate.config.dims import DIMS
from ablate.launcher import group
from ablate.launcher.script import STEP_GRACE_S
from ablate.metrics import collectors

# objectives whose smaller value is better (as the figure registry declares them, and the loss); every other
# figure, a collector's too, is maximised
MINIMISED = tuple(name for name, f in units.FIGURES.items() if f.better == "lower") + ("loss",)
NESTED = ("comm_bytes_by_dim",)   # summary.json nodes an objective may name a key of: comm_bytes_by_dim.tp
STATES = ("complete", "pruned", "failed", "oom")


def grid_size(space: Dict[str, List[str]]) -> int:
    """How many points the space holds (every choice of every knob)."""
    return math.prod(len(v) for v in space.values())


def parse_space(items: List[str]) -> Dict[str, List[str]]:
    """--space K=V1,V2,... (each a Hydra override key and its choices) -> {K: [V1, V2, ...]}."""
    space: Dict[str, List[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        choices = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key or len(choices) < 2:
            raise ConfigError(f"--space {item}: give KEY=V1,V2[,...] (two or more choices), e.g. "
                              "--space parallel=ddp,fsdp2")
        space[key] = choices
    if not space:
        raise ConfigError("give at least one --space KEY=V1,V2")
    return space


def check_objective(objective: str, collector_specs) -> None:
    """The objective is a figure every trial will record: one the registry declares (units.FIGURES), a mesh dim's
    bytes (comm_bytes_by_dim.tp), or one a collector of the trials declares (a `figures` tuple on its class);
    else one line before any trial runs."""
    declared = {name for _, target, _ in collectors.check(collector_specs) for name in getattr(target, "figures", ())}
    node, _, key = objective.partition(".")
    numbers = [name for name in units.FIGURES if not name.endswith("_source")]   # (a source is a word)
    if objective in numbers or objective in declared or (node in NESTED and key in DIMS):
        return
    mine = f"; your collectors declare: {', '.join(sorted(declared))}" if declared else ""
    raise ConfigError(f"--objective {objective}: not a figure every trial records; valid: "
                      f"{', '.join(numbers)}, comm_bytes_by_dim.<{'|'.join(DIMS)}>, or a figure a collector "
                      f"declares (`figures = (...)` on its class: docs/collectors.md){mine}")


def direction(objective: str) -> str:
    return "minimize" if objective in MINIMISED else "maximize"


@dataclass
class Trial:
    number: int
    overrides: List[str]
    state: str = "complete"
    objective: Optional[float] = None
    mem_peak_bytes: Optional[float] = None
    reason: str = ""
    run_dir: str = ""
    seconds: float = 0.0
    extra: Dict[str, object] = field(default_factory=dict)


def prune_reason(overrides: List[str], budget_bytes: Optional[float]) -> Optional[str]:
    """Why this configuration cannot fit the budget (the planned peak per rank, ablate.plan's, without the GPU
    allowance), or None: composed as its run would be, nothing started."""
    from ablate.compose import config_of
    from ablate.train.memory_guard import over_budget
    from ablate.units import fmt

    cfg = config_of(overrides)[1]   # a configuration that cannot be composed is a bad space: said in one line
    if budget_bytes is None:
        return None
    # a trial over the budget that ran anyway is judged by what it measured
    what = over_budget(cfg, budget_bytes)
    return f"needs at least {what} per rank, over the {fmt('bytes', budget_bytes)} budget" if what else None


def run_trial(trial: Trial, run_dir: Path, objective: str, timeout: Optional[float] = None,
              job_step: List[str] = ()) -> Trial:
    """One trial in a fresh process (its own process group: a stopped tune stops all of it), judged; with
    `job_step` (an `srun ...` prefix), a job step of the tune's Slurm allocation."""
    started = time.monotonic()
    done, summary = group.run_ablate(trial.overrides, run_dir, prefix=job_step, timeout=timeout,
                                     grace_s=STEP_GRACE_S if job_step else 0,
                                     then="the same command continues the tune")
    trial.seconds, trial.run_dir = round(time.monotonic() - started, 1), str(run_dir)
    if summary is not None:
        trial.objective, trial.mem_peak_bytes = summary.figure(objective), summary.mem_peak_bytes
        if trial.objective is None:
            trial.state, trial.reason = "failed", summary.notes.get(objective, f"no {objective} recorded")
        return trial
    lines = [ln for ln in (done.stderr or "").strip().splitlines() if ln.strip()]
    trial.reason = lines[-1][:300] if lines else f"exit code {done.returncode}"
    trial.state = "oom" if group.out_of_memory(done) else "failed"
    return trial


def pareto(trials: List[Trial], maximise: bool) -> List[Trial]:
    """The completed trials no other beats on both the objective and peak memory (a point asked again: once)."""
    first = {}
    for t in trials:
        if t.state == "complete" and t.objective is not None and t.mem_peak_bytes is not None:
            first.setdefault(tuple(t.overrides), t)
    done = list(first.values())
    better = (lambda a, b: a > b) if maximise else (lambda a, b: a < b)   # noqa: E731

    def dominated(t: Trial) -> bool:
        return any((better(o.objective, t.objective) or o.objective == t.objective)
                   and o.mem_peak_bytes <= t.mem_peak_bytes and (o.objective != t.objective
                                                                 or o.mem_peak_bytes < t.mem_peak_bytes)
                   for o in done if o is not t)
    return sorted((t for t in done if not dominated(t)), key=lambda t: t.mem_peak_bytes)


def best_two(trials: List[Trial], maximise: bool) -> Tuple[Optional[Trial], Optional[Trial]]:
    """The best trial and the best of another configuration (a point the sampler asked twice is one
    configuration: never its own runner-up)."""
    done = sorted((t for t in trials if t.state == "complete" and t.objective is not None),
                  key=lambda t: t.objective, reverse=maximise)
    if not done:
        return None, None
    others = [t for t in done if t.overrides != done[0].overrides]
    return done[0], (others[0] if others else None)
