"""`python -m ablate [overrides]`: compose once (compose.py) -> launch (launcher/) -> train on each rank (train/).

A single run is composed and checked once before anything is created (compose.run_single); -m and Hydra's
other flags go through hydra.main after every point of the grid was checked (compose.preflight), and each
job of a multirun is then this same command in a fresh process (src/hydra_plugins/).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Dict

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from ablate import CONF_DIR, compose, launcher
from ablate.config import AblateConfig, AblateError, ConfigError, RunStopped, exit_code_of
from ablate.config.command_line import own_model_keys
from ablate.config.store import group_choices, register
from ablate.train import guards
from ablate.train.in_place import in_place
from ablate.train.ranks import rank_env

register()


def start(cfg: DictConfig, checked: AblateConfig, choices: Dict[str, str]):
    """The task Hydra runs in the run dir: the record says what ran, then the ranks start where
    `launcher=` says."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    resolved = compose.run_record(cfg, checked)
    try:
        return launcher.launch(checked, resolved, run_dir, choices)
    except ConfigError:   # found only once running (e.g. a checkpoint that is not there)
        forget_run_dir(run_dir)
        raise


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig):
    """-m and Hydra's flags: Hydra composed `cfg` (the grid was checked before, by compose.preflight)."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN and cfg.logger.get("group") is None:
        cfg.logger.group = f"multirun-{Path(hydra_cfg.sweep.dir).name}"   # ad-hoc sweeps get a W&B group too
    choices = group_choices(hydra_cfg.runtime.choices)
    output_dir = Path(hydra_cfg.runtime.output_dir)
    try:   # Hydra made this job's directory for this call (unless it was there before): claimed as ours, by
        if not rank_env().launched or rank_env().rank == 0:   # rank 0 alone (a Slurm job's tasks share it)
            guards.lock(output_dir, made_here=output_dir.resolve() not in _EXISTED)
    except ConfigError as e:
        sys.exit(exit_code_of(e))
    try:
        checked = compose.validate(cfg, choices)
    except ConfigError as e:
        forget_run_dir(output_dir)
        sys.exit(exit_code_of(e))   # Hydra's own handler would print a traceback
    try:
        return start(cfg, checked, choices)
    except AblateError as e:
        sys.exit(_said(e))


_EXISTED: set = set()   # run dirs named on the command line that were there before this call


def forget_run_dir(run_dir: Path) -> None:
    """A refused command leaves no run dir: remove the one this call made (never one that was there before,
    one that holds a run, or one another call claimed: a second run racing for it touches nothing)."""
    if run_dir.resolve() in _EXISTED or guards.holds_a_run(run_dir) or not guards.claimed(run_dir):
        return
    shutil.rmtree(run_dir, ignore_errors=True)


def _said(error: AblateError) -> int:
    """The one line and exit code of an error that ends the run; under torchrun or srun every rank stops on
    a signal, and rank 0 alone says so."""
    if isinstance(error, RunStopped) and rank_env().rank != 0:
        return error.exit_code
    return exit_code_of(error)


def main() -> None:
    try:
        argv = in_place(sys.argv[1:])   # `train.resume=DIR` alone: that run's own command, in DIR (train/in_place.py)
        argv = own_model_keys(argv)
        guards.check_run_dir_override(argv)   # an empty or over-long name: said before any path is looked at
    except AblateError as e:
        sys.exit(_said(e))
    sys.argv[1:] = argv   # what hydra.main reads, should the command go there
    _EXISTED.update(Path(a.split("=", 1)[1].strip("'\"")).resolve() for a in argv
                    if a.startswith("hydra.run.dir=") and Path(a.split("=", 1)[1].strip("'\"")).exists())
    checked_by_parent = bool(os.environ.pop("ABLATE_PREFLIGHT_DONE", None))   # a sweep checked its whole grid
    try:
        if compose.is_single_run(argv) and compose.run_single(argv, start, checks=not checked_by_parent) \
                is not compose.MULTIRUN:
            return
        if not checked_by_parent:
            compose.preflight(argv)
    except AblateError as e:
        sys.exit(_said(e))
    hydra_main()


if __name__ == "__main__":
    main()
