"""`python -m ablate [overrides]`: validate -> launch (local ranks or Slurm) -> train on each rank."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ablate import CONF_DIR
from ablate.cli import fail, preflight
from ablate.config import ConfigError
from ablate.schema import register, validate

register()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def hydra_main(cfg: DictConfig):
    from ablate import launcher

    hydra_cfg = HydraConfig.get()
    runtime = hydra_cfg.runtime
    if hydra_cfg.mode == RunMode.MULTIRUN and cfg.logger.get("group") is None:
        cfg.logger.group = f"multirun-{Path(hydra_cfg.sweep.dir).name}"   # ad-hoc sweeps get a W&B group too
    try:
        typed = validate(cfg)
    except ConfigError as e:
        fail(str(e))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    choices = {k: v for k, v in runtime.choices.items() if not k.startswith("hydra") and v is not None}
    from ablate.checkpoint import RunStopped

    try:
        return launcher.launch(typed, resolved, Path(runtime.output_dir), choices)
    except ConfigError as e:   # found only once running (e.g. a checkpoint that is not there)
        fail(str(e))
    except RunStopped as e:    # stopped on purpose: a signal, or training that went non-finite
        print(f"ablate: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


def main() -> None:
    try:
        if not os.environ.pop("ABLATE_PREFLIGHT_DONE", None):   # ablate.sweeps validated the whole grid
            preflight(sys.argv[1:])
    except ConfigError as e:
        fail(str(e))
    hydra_main()


if __name__ == "__main__":
    main()
