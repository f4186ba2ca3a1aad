"""`python -m ablate train.resume=DIR`, nothing else typed: the run in DIR continues in DIR, as it was. Its command
line is read back from what Hydra kept of it (DIR/.hydra/hydra.yaml: the task's overrides and the config dirs it
searched), so the run's own config, model and data come back from any directory; every step is logged once in
DIR/metrics.jsonl and nothing is written where the command is typed.

Typed beside it: what only extends or watches the run (more `train.steps`, a decaying schedule's horizon kept with
`optim.decay_steps`, how often it logs or checkpoints, the
logger, what is measured), or the run's own values again; anything else would make it another run, refused in one
line (give `hydra.run.dir=NEW` to continue into
a new run with other values: the checkpoint then says what may change, train/resumable.py). `train.resume` naming
a checkpoint file, or a folder Hydra did not write, and any command with `hydra.run.dir` keep their meaning.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import yaml

from ablate.config import ConfigError
from ablate.config.command_line import absolute_paths

# keys a resume in place may take besides train.resume: they extend or watch the run, not change what it trains
BESIDE = ("train.steps", "optim.decay_steps", "train.log_every", "train.checkpoint_every", "logger", "metrics",
          "launcher.wait")


def resumed_dir(argv: List[str]) -> Optional[Path]:
    """The run dir a command resumes in place, or None (not such a command)."""
    if any(a in ("-m", "--multirun") or a.startswith(("hydra.run.dir=", "-")) for a in argv):
        return None
    given = [a.split("=", 1)[1] for a in argv if a.startswith("train.resume=")]
    if not given:
        return None
    run_dir = Path(given[-1]).expanduser()
    return run_dir.resolve() if (run_dir / ".hydra" / "hydra.yaml").is_file() else None


def saved_command(run_dir: Path) -> List[str]:
    """The run's overrides as Hydra kept them: the config dirs it searched, then its task's."""
    try:
        hydra = (yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text()) or {})["hydra"]
        kept, typed_in = hydra["overrides"], Path(hydra["runtime"]["cwd"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        raise ConfigError(f"train.resume={run_dir}: its .hydra/hydra.yaml cannot be read; give the run's overrides "
                          f"and hydra.run.dir={run_dir} yourself") from None
    searched = [o for o in kept.get("hydra") or [] if o.startswith("hydra.searchpath=")]
    own = [*searched, *(o for o in kept.get("task") or [] if not o.startswith("train.resume="))]
    return absolute_paths(own, typed_in)   # relative paths as the run read them, from any directory


def in_place(argv: List[str]) -> List[str]:
    """The command line that continues the run in place, or argv as it was."""
    run_dir = resumed_dir(argv)
    if run_dir is None:
        return argv
    saved = saved_command(run_dir)
    beside = [a for a in argv if not a.startswith("train.resume=")]
    for arg in beside:
        key = arg.lstrip("+~").split("=", 1)[0]
        if not key.startswith(BESIDE) and arg not in saved:   # (the run's own value typed again changes nothing)
            raise ConfigError(f"{arg}: train.resume={run_dir} continues that run in place, as it was; {key} would "
                              f"make it another run. Valid beside it: {', '.join(BESIDE)}; or continue into a new "
                              "run with hydra.run.dir=NEW")
    return [*saved, *beside, f"train.resume={run_dir}", f"hydra.run.dir={run_dir}"]
