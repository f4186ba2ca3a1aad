"""A `python -m ablate` command line read as Hydra reads it, without composing anything: its overrides, its
`--config-dir` directories (Hydra's searchpath, for a driver's runs to take), and Hydra's informational flags.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from ablate.config.errors import ConfigError

INFO_FLAGS = ("--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version")
TAKES_VALUE = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
               "--experimental-rerun")


def split_argv(argv: List[str]) -> Tuple[List[str], List[str]]:
    """(positional overrides, --config-dir directories) of a `python -m ablate` command line."""
    overrides, config_dirs, skip = [], [], None
    for arg in argv:
        if skip:
            (config_dirs if skip == "dir" else []).append(arg)
            skip = None
        elif arg.startswith(("--config-dir=", "-cd=")):
            config_dirs.append(arg.split("=", 1)[1])
        elif arg in ("--config-dir", "-cd"):
            skip = "dir"
        elif arg.startswith("-"):
            skip = "value" if arg in TAKES_VALUE else None
        else:
            overrides.append(arg)
    return overrides, config_dirs


def config_dir_override(config_dirs: List[str]) -> List[str]:
    """`--config-dir DIR ...` as the one override every run of a driver (tune, maxbatch, sweeps) takes: Hydra's
    searchpath, with absolute paths (a run may start elsewhere)."""
    if not config_dirs:
        return []
    missing = [d for d in config_dirs if not Path(d).is_dir()]
    if missing:
        raise ConfigError(f"--config-dir {missing[0]}: no such directory")
    return [f"hydra.searchpath=[{','.join(f'file://{Path(d).resolve()}' for d in config_dirs)}]"]


def with_search_path(overrides: List[str], config_dirs: List[str]) -> List[str]:
    """--config-dir as a hydra.searchpath override, merged with one given on the command line."""
    given = [o for o in overrides if o.lstrip("+").startswith("hydra.searchpath=")]
    rest = [o for o in overrides if o not in given]
    if not config_dirs:
        return overrides
    paths = [f"file://{d}" for d in config_dirs]
    if given:
        paths += [p.strip() for p in given[-1].split("=", 1)[1].strip("[]").split(",") if p.strip()]
    return [f"hydra.searchpath=[{','.join(paths)}]", *rest]


def config_keys(overrides: List[str]) -> List[str]:
    """The overrides that shape the config: Hydra's own keys left out, but not its searchpath (more choices)."""
    return [o for o in overrides if not o.lstrip("+~").startswith("hydra") or o.startswith("hydra.searchpath=")]
