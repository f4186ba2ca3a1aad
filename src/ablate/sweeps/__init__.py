"""`python -m ablate.sweeps NAME [NAME ...] [--repeats R] [--dir DIR] [-- OVERRIDES]`: run sweeps/ files
with repeats, interleaved, each run in a fresh process, then the report.

Order: every arm once per block, block after block (A B, A B, ...: drift on a shared machine hits both
arms alike), or `--order random` (each block shuffled). Each run is `python -m ablate +sweeps=NAME
<arm> sweep.repeat=K` in its own process (allocator, NCCL and CUDA settings are per process), and every
run shares this host's one measured peak (metrics/peak.py; --measure-peak measures it again), so MFU
has one denominator.
`python -m ablate.sweeps --list` lists the sweeps; `week4` is the whole table (sweeps/week4.yml:
a suite, a list of sweeps; .yml so that Hydra, which reads only .yaml, does not offer it as `+sweeps=week4`).
A factorial sweep (`design: factorial`) runs its design's cells in randomized blocks; a stack
(`design: stack`) runs the arms design.stack names.

This package: __init__.py reads the sweeps/ files and plans the runs; runner.py runs them (and continues
an earlier call, reruns outliers); __main__.py is the command line (and --repeats auto's looks).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import List, Optional, Tuple

import yaml

from ablate import SWEEPS_DIR, design
from ablate.config import ConfigError

SUITE_SUFFIX = ".yml"   # sweeps/<name>.yml lists sweeps (week4); sweeps/<name>.yaml is one sweep (a Hydra config)
# where sweeps/ files are found: a user's config dirs (`--config-dir DIR`: DIR/sweeps/) first, then ablate's own
SEARCH: List[Path] = [SWEEPS_DIR]


def use_config_dirs(dirs: List[str]) -> List[str]:
    """Look for sweeps in DIR/sweeps/ of each user config dir too; returns the override that gives every run
    (and Hydra's composition of `+sweeps=NAME`) the same dirs: hydra.searchpath."""
    if not dirs:
        return []
    SEARCH[:0] = [Path(d).resolve() / "sweeps" for d in dirs]
    return [f"hydra.searchpath=[{','.join(f'file://{Path(d).resolve()}' for d in dirs)}]"]


def _path(name: str) -> Path:
    for folder in SEARCH:
        for candidate in (folder / f"{name}{SUITE_SUFFIX}", folder / f"{name}.yaml"):
            if candidate.exists():
                return candidate
    return SWEEPS_DIR / f"{name}.yaml"


def load(name: str) -> dict:
    """A sweep file, read whole: YAML text holding a mapping (hydra:, sweep:, defaults: ...), or one line."""
    path = _path(name)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file; a sweep file is YAML (sweeps/README.md)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping (defaults:, hydra:, sweep:, ...), not a "
                          f"{type(data).__name__}; sweeps/README.md shows one")
    if path.suffix == ".yaml" and PACKAGE_HEADER not in path.read_text().splitlines()[:5]:
        raise ConfigError(f"{path}: a sweep file begins with the line `{PACKAGE_HEADER}` (it sets keys of every "
                          "group: model, train, hydra, ...); add it as its first line (sweeps/README.md)")
    return data


PACKAGE_HEADER = "# @package _global_"   # Hydra's: the file's keys are the whole config's, not sweeps.<key>


def knob_value(cfg, knob: str):
    """The value a run's typed config gives a sweep's knob (`parallel.no_sync`, `sweep.arm`, `optim.name`)."""
    value = cfg
    for part in knob.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
    return value


def check_arms(name: str, configs) -> None:
    """A sweep that compares arms of a knob has its baseline and each treatment among its runs: else nothing it
    trains could be compared (one line, before any run)."""
    node = load(name).get("sweep") or {}
    knob = node.get("knob")
    if not knob or node.get("design") is not None:
        return
    seen = {str(knob_value(cfg, knob)).lower() for cfg in configs}
    treatments = node.get("treatment") if isinstance(node.get("treatment"), list) else [node.get("treatment")]
    for role, value in [("baseline", node.get("baseline"))] + [("treatment", t) for t in treatments]:
        if str(value).lower() not in seen:
            raise ConfigError(f"sweep.{role}={value}: no run of sweep {name} has {knob}={value}; its runs have "
                              f"{knob} = {', '.join(sorted(seen))}: add it to the grid (hydra.sweeper.params) or name "
                              "one of those")


def available() -> List[str]:
    return sorted({p.stem for folder in SEARCH for pattern in ("*.yaml", f"*{SUITE_SUFFIX}")
                   for p in folder.glob(pattern)})


def expand(names: List[str]) -> List[str]:
    out = []
    for name in names:
        if name not in available():
            raise ConfigError(f"no sweep '{name}'; valid choices: {', '.join(available())}")
        data = load(name)
        out += data["sweeps"] if isinstance(data.get("sweeps"), list) else [name]
    return out


def listing() -> str:
    rows = []
    for name in available():
        data = load(name)
        if isinstance(data.get("sweeps"), list):
            rows.append(f"{name:<14} the whole table: {', '.join(data['sweeps'])}")
            continue
        s, params = data.get("sweep", {}), (data.get("hydra", {}).get("sweeper", {}).get("params") or {})
        arms = ", ".join(f"{k}={v}" for k, v in params.items() if k != "sweep.repeat")
        what = {"factorial": f"factorial: {arms}",
                "stack": "stack: " + ", ".join(a.label for a in design.stack(s)) if s.get("design") == "stack" else ""
                }.get(s.get("design"), f"knob: {s.get('knob')}; arms: {arms}")
        rows.append(f"{name:<14} {s.get('claim', ''):<3} {s.get('technique', '')}\n{'':<19}claim: "
                    f"{s.get('claimed_text', '')}\n{'':<19}{what}")
    return "\n".join(rows)


def is_side_arm(name: str, combo: List[str]) -> bool:
    """An arm that is neither the sweep's baseline nor its treatment (C4's fp16): drawn, not judged."""
    s = load(name).get("sweep", {})
    knob = s.get("knob", "")
    for o in combo:
        key, _, value = o.partition("=")
        if key in (knob, knob.rsplit(".name", 1)[0]):
            treatment = s.get("treatment")   # one arm, or several (sweeps/layouts.yaml)
            judged = [s.get("baseline"), *(treatment if isinstance(treatment, list) else [treatment])]
            return value not in {str(v) for v in judged} | {str(v).lower() for v in judged}
    return False


def plan_runs(names: List[str], extra: List[str], repeats: int, order: str, seed: int,
              side_arms_once: bool = True) -> List[Tuple[str, List[str], int]]:
    """(sweep, overrides, repeat) for every run, in running order; validates every point first. Side arms
    run once (repeat 0) unless asked: they are drawn but judged by no check, and can be slow (fp16 on a CPU)."""
    from ablate.compose import grid, hydra_context, preflight
    from ablate.config.store import register

    register()
    runs = []
    for name in names:
        node = load(name).get("sweep", {})
        if node.get("design") == "stack":   # arms listed by the file, not a grid: each checked like a grid point
            combos = [[f"+sweeps={name}", *arm.overrides, f"sweep.arm={arm.label}", *extra]
                      for arm in design.stack(node)]
            for combo in combos:
                preflight(combo)
        else:
            preflight([f"+sweeps={name}", *extra])       # one line and nothing run, on any bad point
            with hydra_context():
                combos = [[o for o in c if not o.startswith("sweep.repeat=")]
                          for c in grid([f"+sweeps={name}", *extra])]
            combos = in_design(name, combos)
        rng = random.Random(seed)
        for r in range(repeats):
            block = [c for c in combos if r == 0 or not (side_arms_once and is_side_arm(name, c))]
            if (order or ("random" if is_factorial(name) else "interleaved")) == "random":
                rng.shuffle(block)
            runs += [(name, combo, r) for combo in block]
    return runs


def load_design(combo: List[str]) -> Optional[str]:
    name = next((o.split("=", 1)[1] for o in combo if o.startswith("+sweeps=")), None)
    return load(name).get("sweep", {}).get("design") if name else None


def is_factorial(name: str) -> bool:
    """A factorial sweep runs in randomized blocks (one per repeat) unless --order says otherwise."""
    return load(name).get("sweep", {}).get("design") == "factorial"


def in_design(name: str, combos: List[List[str]]) -> List[List[str]]:
    """A factorial sweep's grid cut to its design's points (a `fraction`); any other sweep's grid as is."""
    s = load(name).get("sweep", {})
    if s.get("design") != "factorial" or not s.get("fraction"):
        return combos
    cells = design.build(s["factors"], s["fraction"])
    wanted = [set(cells.overrides(point)) for point in cells.points]
    return [c for c in combos if any(w <= set(c) for w in wanted)]


def _label(combo: List[str], extra: List[str]) -> str:
    """The arm: its `sweep.arm` when it has one (a stack), else the overrides that are not the sweep itself
    nor the caller's fixed extras."""
    arm = next((o.split("=", 1)[1] for o in combo if o.startswith("sweep.arm=")), None)
    if arm and load_design(combo) == "stack":
        return arm
    fixed = {o.split("=", 1)[0] for o in extra}   # Hydra rewrites values (false -> False): compare keys
    return " ".join(o for o in combo if not o.startswith("+sweeps=") and o.split("=", 1)[0] not in fixed) or "default"
