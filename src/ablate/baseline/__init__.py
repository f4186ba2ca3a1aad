"""A regression gate: a finished sweep kept as a baseline (`save`), and a later sweep checked against it
(`check.py`), with a pass/fail a CI can act on. `python -m ablate.baseline save|check|list|show`.

A baseline keeps what a later check needs, not the runs: each arm's figures per run, its resolved config,
the commit (and whether the tree was dirty), the versions, host and hardware, and the noise floor in force.
The store is a folder (default: the user cache, `ablate.user_cache_dir()/baselines`; a shared folder works for
a team), one JSON file per name; with W&B credentials it is also logged as a W&B artifact.
"""
from __future__ import annotations

import json
import os
import re
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional

from ablate import units, user_cache_dir
from ablate.config import ConfigError
from ablate.report import noise
from ablate.report import runs as R

# what a check compares (the registry of figures, units.py): rates and sizes with the direction that is better;
# counts compared exactly
TIMED = {m: units.FIGURES[m].better for m in units.in_view("gate") if not units.is_exact(m)}
EXACT = tuple(m for m in units.in_view("gate") if units.is_exact(m))
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def store_dir(store: Optional[str]) -> Path:
    return Path(store) if store else user_cache_dir() / "baselines"


def arm_label(run: R.Run) -> str:
    """Which arm a run is, the same way in two sweeps made days apart: the sweep's name and its knob's value
    (or stack arm), else the run's group choices."""
    s = run.sweep
    if s.get("name") and s.get("knob"):
        return f"{s['name']}: {s['knob']}={run.knob(s['knob'])}"
    if s.get("name") and run.knob("sweep.arm"):
        return f"{s['name']}: {run.knob('sweep.arm')}"
    choices = run.summary.get("choices") or {}
    return " ".join(f"{k}={v}" for k, v in sorted(choices.items()) if k not in ("logger", "launcher")) or "run"


def comparable_config(run: R.Run) -> Dict[str, object]:
    """The run's config less what never makes runs differ (repeats, run dirs, loggers)."""
    return {k: v for k, v in R.flatten(run.config).items() if not k.startswith(R.NOT_A_KNOB)}


def runs_of(sweep_dir: Path) -> List[R.Run]:
    if not sweep_dir.is_dir():
        raise ConfigError(f"{sweep_dir}: no such directory")
    runs, _ = R.find([sweep_dir])
    runs, _ = R.reruns(runs)
    if not runs:
        raise ConfigError(f"{sweep_dir}: no finished runs (no summary.json) to take figures from")
    return runs


def figures(runs: List[R.Run]) -> Dict[str, Dict[str, object]]:
    """{arm: {config, runs: [{metric: value}]}}: what a baseline keeps and what a check compares."""
    arms: Dict[str, Dict[str, object]] = {}
    for run in sorted(runs, key=lambda r: (arm_label(r), r.repeat or 0, str(r.path))):
        arm = arms.setdefault(arm_label(run), {"config": comparable_config(run), "runs": []})
        arm["runs"].append({m: run.metric(m) for m in (*TIMED, *EXACT)})
    return arms


def provenance_of(runs: List[R.Run]) -> Dict[str, object]:
    first = runs[0].summary
    prov = first.get("provenance") or {}
    return {"commit": prov.get("git_commit"), "dirty": any((r.summary.get("provenance") or {}).get("git_dirty")
                                                           for r in runs),
            "host": prov.get("hostname"), "versions": first.get("versions") or {},
            "hardware": sorted({r.machine for r in runs})}


def record(sweep_dir: Path, name: str) -> Dict[str, object]:
    runs = runs_of(sweep_dir)
    floor = next((e for e in noise.cached().values() if e.get("host") == socket.gethostname()), None)
    return {"name": name, "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source": str(sweep_dir.resolve()), **provenance_of(runs), "noise_floor": floor,
            "arms": figures(runs)}


def save(sweep_dir: Path, name: str, store: Optional[str] = None) -> Path:
    if not NAME.match(name):
        raise ConfigError(f"--name {name}: letters, digits, '.', '_' and '-' only (a file name)")
    entry = record(sweep_dir, name)
    folder = store_dir(store)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(entry, indent=1, default=str))
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigError(f"--store {folder}: cannot write there ({e.strerror})") from None
    log_artifact(path, name)
    return path


def log_artifact(path: Path, name: str) -> Optional[str]:
    """With W&B credentials, the baseline as a W&B artifact (type ablate-baseline); without, nothing."""
    if not os.environ.get("WANDB_API_KEY"):
        return None
    import wandb

    run = wandb.init(project=os.environ.get("WANDB_PROJECT", "ablate"), job_type="baseline", name=f"baseline-{name}")
    artifact = wandb.Artifact(name, type="ablate-baseline")
    artifact.add_file(str(path))
    run.log_artifact(artifact)
    run.finish()
    return name


def load(name: str, store: Optional[str] = None, given: str = "--against ") -> Dict[str, object]:
    """A saved baseline by name (`given`: how the command took the name, for its one line)."""
    path = store_dir(store) / f"{name}.json"
    if not path.exists():
        known = ", ".join(listing(store)) or "none saved yet"
        raise ConfigError(f"{given}{name}: no such baseline in {store_dir(store)}; valid choices: {known}")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path}: not a readable baseline ({e})") from None


def listing(store: Optional[str] = None) -> List[str]:
    folder = store_dir(store)
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
