"""`python -m ablate [overrides]`: validate -> launch (local ranks or Slurm) -> train on each rank."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ablate import CONF_DIR
from ablate.compose import fail, preflight
from ablate.config import ConfigError
from ablate.config.store import LABELLED_BY_CHOICE, register, validate
from ablate.train import guards

register()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig):
    from ablate import launcher

    hydra_cfg = HydraConfig.get()
    runtime = hydra_cfg.runtime
    if hydra_cfg.mode == RunMode.MULTIRUN and cfg.logger.get("group") is None:
        cfg.logger.group = f"multirun-{Path(hydra_cfg.sweep.dir).name}"   # ad-hoc sweeps get a W&B group too
    choices = {k: v for k, v in runtime.choices.items() if not k.startswith("hydra") and v is not None}
    run_dir = Path(runtime.output_dir)
    try:
        typed = validate(cfg, choices)
    except ConfigError as e:
        forget_run_dir(run_dir)
        fail(str(e))
    for group in LABELLED_BY_CHOICE:     # the record says what ran
        cfg[group].name = getattr(typed, group).name
    resolved = OmegaConf.to_container(cfg, resolve=True)
    from ablate.train.checkpoint import RunStopped

    try:
        return launcher.launch(typed, resolved, run_dir, choices)
    except ConfigError as e:   # found only once running (e.g. a checkpoint that is not there)
        forget_run_dir(run_dir)
        fail(str(e))
    except RunStopped as e:    # stopped on purpose: a signal, or training that went non-finite
        print(f"ablate: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


_EXISTED: set = set()   # run dirs named on the command line that were there before this call


def forget_run_dir(run_dir: Path) -> None:
    """A refused command leaves no run dir: remove the one Hydra made for this call (never one that was
    there before, nor one that holds a run)."""
    if run_dir.resolve() in _EXISTED or guards.holds_a_run(run_dir):
        return
    shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    _EXISTED.update(Path(a.split("=", 1)[1].strip("'\"")).resolve() for a in sys.argv[1:]
                    if a.startswith("hydra.run.dir=") and Path(a.split("=", 1)[1].strip("'\"")).exists())
    try:
        if not os.environ.pop("ABLATE_PREFLIGHT_DONE", None):   # ablate.sweeps validated the whole grid
            preflight(sys.argv[1:])
    except ConfigError as e:
        fail(str(e))
    hydra_main()


if __name__ == "__main__":
    main()
