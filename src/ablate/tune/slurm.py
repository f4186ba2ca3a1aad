"""A tune on Slurm: ONE allocation (sweeps/allocation.py, as for a sweep), the tune's driver inside it and each
trial a job step; outside any allocation, or with launcher=local, a trial is a fresh process here."""
from __future__ import annotations

import itertools
from typing import Dict, List

from ablate import compose
from ablate.config import AblateConfig
from ablate.sweeps import allocation


def points(space: Dict[str, List[str]], base: List[str]) -> List[List[str]]:
    """Every trial's overrides the space holds."""
    return [[*base, *[f"{k}={v}" for k, v in zip(space, values)]] for values in itertools.product(*space.values())]


def trial_configs(space: Dict[str, List[str]], base: List[str]) -> Dict[tuple, AblateConfig]:
    """Each point's typed config: whether the tune needs an allocation, how large, and each trial's job step."""
    combos = points(space, base)
    return dict(zip(map(tuple, combos), compose.checked(combos)))


def driver_command(args, base: List[str]) -> List[str]:
    """This call's arguments as the allocation's driver gets them: every option explicit, --dir absolute."""
    flags = [*[f"--space={s}" for s in args.space], f"--objective={args.objective}", f"--trials={args.trials}",
             f"--confirm={args.confirm}", f"--dir={args.dir.resolve()}", f"--seed={args.seed}",
             *([f"--mem-budget-gb={args.mem_budget_gb}"] if args.mem_budget_gb else []),
             *([f"--trial-timeout={args.trial_timeout}"] if args.trial_timeout else [])]
    return ["-u", "-m", "ablate.tune", *flags, "--", *base]


class Steps:
    """Where each trial runs: here in a fresh process, or (inside the tune's allocation) as a job step of it."""

    def __init__(self, configs: Dict[tuple, AblateConfig]):
        self.inside = allocation.Steps(configs, allocation.TUNE) if allocation.allocates(configs) else None

    def prefix(self, overrides: List[str], name: str) -> List[str]:
        return self.inside.prefix(overrides, name) if self.inside else []

    def requeue_if_warned(self, title: str) -> None:
        if self.inside:
            self.inside.requeue_if_warned(title)
