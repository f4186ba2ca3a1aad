"""launcher=slurm, the registry's entry: refuse what the cluster can never run, then submit the run, queue it
as one point of a job array, or, inside a job step, train here."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

from ablate.config import AblateConfig
from ablate.launcher import array as slurm_array
from ablate.launcher import job_check, slurm
from ablate.train import trainer as train
from ablate.train.ranks import rank_env


def check(cfg: AblateConfig) -> None:
    """The request and the cluster (slurm.py), then the job as a local run is checked, in the environment it will
    have (job_check.py); a task of the job's step checks nothing more (its request passed before it queued)."""
    here = rank_env()
    if here.launched or here.slurm_step is not None:
        return
    slurm.check(cfg.launcher)
    job_check.check(cfg)


def launch(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str], applied: Dict):
    here = rank_env()
    if here.launched or here.slurm_step is not None:   # a task of a job step (srun, the dry run's script): train here
        return train.run(cfg, run_dir, resolved, choices, applied)
    array_file = os.environ.pop("ABLATE_SLURM_ARRAY", None)
    if array_file:   # one point of a sweep: the sweep's launcher submits all points as one job array
        return slurm_array.queue(Path(array_file), *slurm.prepare(cfg, resolved, run_dir, choices, applied))
    return slurm.submit(cfg, resolved, run_dir, choices, applied)
