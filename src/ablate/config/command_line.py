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


# ablate's own keys of every model file (config/models.py USER_MODEL_KEYS) that a user's file need not write:
# Hydra sets a key the file lacks only with `++`, so `model.activation_checkpointing=true` is read as that
OWN_MODEL_KEYS = ("model.activation_checkpointing", "model.blocks")


def own_model_keys(args: List[str]) -> List[str]:
    """`model.activation_checkpointing=V` (and model.blocks) as `++model.activation_checkpointing=V`: the documented
    key works on a user's model file that does not write it, as on the built-in ones."""
    return [f"++{a}" if a.split("=", 1)[0] in OWN_MODEL_KEYS and "=" in a else a for a in args]


def split_argv(argv: List[str]) -> Tuple[List[str], List[str]]:
    """(positional overrides, --config-dir directories) of a `python -m ablate` command line."""
    argv = own_model_keys(argv)
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


# overrides that name a path a run reads (besides hydra.searchpath's config dirs): made absolute wherever a command
# is carried to another directory (a dry run's sbatch script, a resume in place typed elsewhere)
PATH_KEYS = ("data.path", "model.config", "train.resume", "hydra.run.dir", "hydra.sweep.dir")


def absolute_paths(overrides: List[str], cwd: Path) -> List[str]:
    """The overrides with every relative path they name (PATH_KEYS, hydra.searchpath's file:// entries) resolved
    against `cwd`, the directory the command was typed in."""
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        bare = key.lstrip("+~")
        if sep and bare == "hydra.searchpath":
            value = "[" + ",".join(_absolute_search(p.strip(), cwd) for p in value.strip("[]").split(",")) + "]"
        elif sep and bare in PATH_KEYS and value.strip("'\"") and not value.startswith(("/", "$", "~")):
            value = str(cwd / value.strip("'\""))
        out.append(f"{key}{sep}{value}")
    return out


def _absolute_search(entry: str, cwd: Path) -> str:
    if not entry.startswith("file://") or entry[len("file://"):].startswith("/"):
        return entry   # pkg://, or already absolute
    return f"file://{cwd / entry[len('file://'):]}"
