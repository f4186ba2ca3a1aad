"""Command-line checks before Hydra runs anything: a bad choice, type or value, or a combination this
machine cannot run, ends in ONE line naming the key and the valid choices, exit code 2, no traceback,
and no run directory created."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, NoReturn

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from ablate import CONF_DIR, SWEEPS_DIR
from ablate.config import AblateConfig, ConfigError, register, validate

EXIT_USAGE = 2


def fail(message: str) -> NoReturn:
    print(f"ablate: error: {message}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def group_choices(conf_dir: Path = CONF_DIR) -> Dict[str, List[str]]:
    """{group: [choice, ...]} from the YAML files under conf/ (the sweep group included)."""
    out = {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in conf_dir.iterdir() if d.is_dir()}
    out["sweeps"] = sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml") if p.stem != "week4")
    return out


def _overrides(argv: List[str]) -> List[str]:
    """Hydra's positional overrides (flags such as -m, --cfg job, hydra.* settings left out)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            skip = arg in ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                           "--config-dir", "-cd", "--experimental-rerun", "--info", "-i") and "=" not in arg
            continue
        if not arg.lstrip("+~").startswith("hydra"):
            out.append(arg)
    return out


def _check_choices(parsed, choices: Dict[str, List[str]]) -> None:
    for o in parsed:
        group = o.key_or_group
        if group not in choices or o.is_delete():
            continue
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_string()]
        for value in values:
            if value not in choices[group]:
                raise ConfigError(f"{group}={value}: no such choice for '{group}'; valid choices: "
                                  f"{', '.join(choices[group])}")


def _first_line(e: BaseException) -> str:
    """Hydra's own message ("Error merging override train.steps=abc") and its cause's first line."""
    lines = [str(x).strip().splitlines()[0] for x in (e, e.__cause__) if x is not None and str(x).strip()]
    return ": ".join(dict.fromkeys(lines)) or type(e).__name__


def check_hardware(cfg: AblateConfig) -> None:
    """What this machine cannot run, said before anything starts (Slurm nodes check for themselves)."""
    if cfg.launcher.name == "slurm":
        from ablate.slurm import check as check_slurm

        check_slurm(cfg.launcher)
        return
    import torch

    from ablate.distributed import device_type
    from ablate.train import check_runnable

    check_runnable(cfg, torch.device(device_type(cfg.train.device)))


def _sweeper_params(parsed) -> List[str]:
    """A sweeps/ file's own grid (hydra.sweeper.params), less the keys the command line sets itself."""
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    cfg = compose("config", overrides=fixed, return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params") or {}
    given = {o.get_key_element() for o in parsed}
    return [f"{k}={v}" for k, v in params.items() if k not in given and f"+{k}" not in given]


def _validate(combo: List[str], hardware: bool) -> None:
    try:
        cfg = compose("config", overrides=list(combo))
    except Exception as e:
        raise ConfigError(_first_line(e)) from None
    try:
        typed = validate(cfg)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(_first_line(e)) from None
    if hardware:
        check_hardware(typed)


def preflight(argv: List[str], hardware: bool = True) -> None:
    """Compose every combination the command line (and a sweeps/ file's grid) asks for and validate it,
    or fail in one line."""
    register()
    overrides = _overrides(argv)
    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except Exception as e:
        raise ConfigError(_first_line(e)) from None
    choices = group_choices()
    _check_choices(parsed, choices)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3", job_name="ablate"):
        try:
            overrides = _sweeper_params(parsed) + overrides
            parsed = parser.parse_overrides(overrides)
        except Exception as e:
            raise ConfigError(_first_line(e)) from None
        _check_choices(parsed, choices)
        for combo in BasicSweeper.split_arguments(parsed, None)[0] if parsed else [[]]:
            _validate(combo, hardware)
