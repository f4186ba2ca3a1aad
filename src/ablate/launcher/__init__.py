"""conf/launcher -> where the ranks run: on this machine (local.py: in this process, or as local processes
through torch's elastic launcher) or as a Slurm job (slurm_launch.py: submitit, job arrays, job steps).

The registry is data: composing and checking a command line imports no launcher, trainer, torch.distributed
or submitit (a refused command costs less than `import torch`); the chosen launcher's module is imported
when a run is checked against this machine or starts.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Dict, Optional

import yaml

from ablate.config import AblateConfig
from ablate.launcher import environment, script
from ablate.train import guards
from ablate.train.ranks import rank_env

# launcher=<name> -> the module that implements it: check(cfg) before anything starts, launch(...) the run.
# The one place a launcher choice is decoded.
REGISTRY = {"local": "ablate.launcher.local", "slurm": "ablate.launcher.slurm_launch"}
# launcher=<name> -> a sweep's run as a job step of the sweep's one allocation (sweeps/allocation.py), or
# None: the run is a process of its own on this machine
JOB_STEP = {"local": None, "slurm": script.job_step}


def implementation(name: str):
    return importlib.import_module(REGISTRY[name])


def check(cfg: AblateConfig) -> None:
    """What the chosen launcher cannot run (this machine's hardware, or the Slurm partition), one line."""
    implementation(cfg.launcher.name).check(cfg)


def _write_config(run_dir: Path, resolved: Dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = {k: v for k, v in resolved.items() if k != "hydra"}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(plain, sort_keys=False))


def launch(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str]) -> Optional[Dict]:
    """Write the run's config, apply the allocator/NCCL environment (in the submitting process too: the
    sbatch script exports it), then start the ranks where `launcher=` says. A directory that already holds
    a run, or that another live run writes into, is refused (train/guards.py)."""
    owner = rank_env().rank == 0     # several tasks of one job (srun, torchrun) share the directory: rank 0 owns it
    if owner:
        guards.check_fresh(run_dir, cfg.train.resume)
        guards.lock(run_dir)
    try:
        _write_config(run_dir, resolved)
        with environment.applied(cfg) as applied:
            return implementation(cfg.launcher.name).launch(cfg, resolved, run_dir, choices, applied)
    finally:
        guards.release(run_dir)
