"""Finding runs on disk and grouping them for the report: sweep -> arms (knob values) -> repeats.

Reads only run directories (summary.json, config.yaml): never imports the trainer. Every run found is
kept: repeats are grouped, never dropped, and a run directory without a summary is listed as unfinished.
Runs that are not of a sweeps/ file are grouped by what differs in their configs (adhoc.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

from ablate.config import record
from ablate.config.dims import label as mesh_label
from ablate.report.plan import set_aside

# keys that never make two runs different arms: repeat axes, bookkeeping, where files go
NOT_A_KNOB = ("hydra", "logger", "sweep", "train.seed", "train.resume", "metrics.peak_cache",
              "metrics.measure_peak", "launcher.folder",
              "launcher.wait", "launcher.dry_run")


# folders inside a run that hold config.yaml files of their own: a checkpoint, a run's batch search
# (sweeps.batch_search) and that search's trials, W&B's own files (the report run's, under the report dir)
NOT_A_RUN = {"checkpoint", "max_batch", "max_batch_trials", "wandb"}


@dataclass
class Run:
    path: Path
    summary: Dict
    config: Dict
    derived: Dict = field(default_factory=dict)   # figures the report computes across runs (common_peak)

    @property
    def sweep(self) -> Dict:
        return self.summary.get("sweep") or self.config.get("sweep") or {}

    def knob(self, dotted: str):
        node = self.config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    def invalid(self, name: str) -> Optional[str]:
        """Why this run's figure `name` must not be used (summary.json's `invalid`, or a figure the report
        derived from an invalid one), or None."""
        entry = (self.summary.get("invalid") or {}).get(name) or self.derived.get("invalid", {}).get(name)
        return entry["reason"] if entry else None

    def metric(self, name: str):
        """The figure, or None when it is absent or invalid (an invalid figure feeds no verdict, effect or plot)."""
        if self.invalid(name):
            return None
        if name in self.derived:
            return self.derived[name]
        if name == "state_bytes_total":
            per_rank = [sum(r["state_bytes"].values()) for r in self.summary.get("per_rank", [])
                        if r.get("state_bytes")]
            return max(per_rank) if per_rank else None
        if name not in self.summary and "." in name:   # a figure kept by key: comm_bytes_by_dim.tp
            node, key = name.split(".", 1)
            return (self.summary.get(node) or {}).get(key)
        return self.summary.get(name)

    @property
    def repeat(self) -> Optional[int]:
        return self.sweep.get("repeat")

    @property
    def on_gpu(self) -> bool:
        return str(self.summary.get("device", "cpu")).startswith("cuda")

    @property
    def machine(self) -> str:
        """The machine the figures depend on: the device model (and a CPU's cores), provenance when recorded.
        Runs are paired only on one machine; the number of ranks is a knob, not the machine."""
        prov = self.summary.get("provenance") or {}
        device = prov.get("gpu_name") if self.on_gpu else prov.get("cpu_model")
        device = device or self.summary.get("device_name", "?")
        cores = f", {prov['cpu_cores']} cores" if not self.on_gpu and prov.get("cpu_cores") else ""
        return f"{device}{cores}"

    @property
    def hardware(self) -> str:
        """The machine and the number of devices the run used."""
        return f"{self.machine} x{self.summary.get('world_size', 1)}"

    @property
    def layout(self) -> str:
        """The run's mesh as dp_replicate x dp_shard x tp (summary.json's `mesh`); "—" for a run that has none."""
        mesh = self.summary.get("mesh")
        return mesh_label(mesh) if mesh else "—"

    def level(self, knob: str):
        """A factor's level: a config group's chosen `name`, else the dotted key's value."""
        node = self.config.get(knob)
        return node.get("name") if isinstance(node, dict) else self.knob(knob)


@dataclass
class Arm:
    value: object
    runs: List[Run] = field(default_factory=list)

    def values(self, metric: str) -> List[Optional[float]]:
        return [r.metric(metric) for r in self.runs]


@dataclass
class Group:
    """One comparison: a sweep's arms, or the arms of an ad-hoc set of runs."""
    name: str
    sweep: Dict                       # the sweeps/ node (knob, baseline, treatment, checks, claim...)
    arms: Dict[str, Arm]              # role ("baseline", "treatment", or the knob value) -> arm
    replaced: Dict[str, Run] = field(default_factory=dict)   # a rerun's path -> the outlier run it replaces

    def pairs(self) -> Tuple[List[Run], List[Run]]:
        """Baseline and treatment runs paired by repeat index (order of running when not recorded)."""
        base, treat = self.arms.get("baseline"), self.arms.get("treatment")
        if base is None or treat is None:
            return [], []
        n = min(len(base.runs), len(treat.runs))
        return base.runs[:n], treat.runs[:n]

    @property
    def unpaired(self) -> List[Run]:
        base, treat = self.pairs()
        paired = {id(r) for r in base + treat}
        return [r for arm in self.arms.values() for r in arm.runs
                if id(r) not in paired and arm in (self.arms.get("baseline"), self.arms.get("treatment"))]


def _load(path: Path) -> Dict:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def find(dirs: List[Path]) -> Tuple[List[Run], List[Path]]:
    """(finished runs, run dirs without a summary) under these directories, in path order; a run named twice (the
    same directory given twice, or one inside another given) is one run."""
    runs, unfinished, seen = [], [], set()
    for d in dirs:
        for config_path in sorted(Path(d).rglob("config.yaml")):
            run_dir = config_path.parent
            if run_dir.name == ".hydra" or set(run_dir.parts) & NOT_A_RUN or set_aside(run_dir):
                continue   # (a run a later call of its sweep set aside and ran again: ablate.sweeps)
            if run_dir.resolve() in seen:
                continue
            seen.add(run_dir.resolve())
            if not record.exists(run_dir):
                unfinished.append(run_dir)
                continue
            try:
                summary = record.load(run_dir)
            except record.RecordError as e:   # truncated or damaged: named, and the rest still reported
                print(f"ablate.report: warning: {e}; that run is left out", file=sys.stderr)
                continue
            if summary.kind != "run":   # a batch search's own record (C5 keeps it inside its arm's run)
                continue
            runs.append(Run(run_dir, summary.data, _load(config_path)))
    return runs, unfinished


def _order(run: Run) -> Tuple:
    return (run.repeat if run.repeat is not None else 10**9, str(run.path))


def by_design(runs: List[Run], kind: str) -> Dict[str, List[Run]]:
    """The runs of sweeps/ files with `design: <kind>` (factorial, stack), by sweep name."""
    out: Dict[str, List[Run]] = {}
    for run in runs:
        if run.sweep.get("design") == kind:
            out.setdefault(run.sweep["name"], []).append(run)
    return out


def reruns(runs: List[Run]) -> Tuple[List[Run], Dict[str, Run]]:
    """(the runs with each rerun outlier's rerun in its place, {rerun path: the original}). `rerun_as` is
    the rerun's folder name, beside the original's."""
    by_path = {r.path.resolve(): r for r in runs}
    replaced = {}
    for run in runs:
        rerun = by_path.get((run.path.parent / run.summary["rerun_as"]).resolve()) \
            if run.summary.get("rerun_as") else None
        if rerun is not None:
            replaced[str(rerun.path)] = run
    originals = {id(r) for r in replaced.values()}
    return [r for r in runs if id(r) not in originals], replaced


def common_peak(runs: List[Run], reference: List[Run]) -> None:
    """`mfu_common_peak` for these runs: each run's model FLOP rate over ONE peak, the reference runs'
    (median) peak_flops, so arms of different precisions compare as speeds (each run's own-peak `mfu`
    stays beside it)."""
    peaks = sorted(p for p in (r.summary.get("peak_flops") for r in reference) if p)
    if not peaks:
        return
    peak = peaks[len(peaks) // 2]
    # a reference run faster than its own peak (its mfu invalid): that peak is too low to divide anything by
    below = [r.path.name for r in reference if r.invalid("mfu")]
    for run in runs:
        rate, fpt = run.summary.get("tokens_per_s_per_device"), run.summary.get("flops_per_token")
        run.derived["mfu_common_peak"] = rate * fpt / peak if rate and fpt else None
        run.derived["common_peak_flops"] = peak
        run.derived.get("invalid", {}).pop("mfu_common_peak", None)
        if below:
            run.derived.setdefault("invalid", {})["mfu_common_peak"] = {
                "value": run.derived["mfu_common_peak"],
                "reason": f"the common peak ({peak / 1e12:.3g} TFLOP/s) is below what {', '.join(below[:3])} "
                          "achieved (their mfu is invalid): a peak measured on a busy host?"}


def add_common_peak(group: Group) -> None:
    """common_peak for a group's arms against its baseline's peak."""
    base = group.arms.get("baseline") or next(iter(group.arms.values()), None)
    common_peak([r for arm in group.arms.values() for r in arm.runs], base.runs if base else [])


def title(sweep: Dict, name: str) -> str:
    """A sweep's heading: a week-4 claim with its technique (`C3 — no_sync`), or a sweep of the user's by its
    technique or name (no claim to name)."""
    claim, technique = sweep.get("claim"), sweep.get("technique") or ""
    return f"{claim} — {technique}" if claim else (technique or name)


def one_treatment_each(sweep: Dict) -> List[Tuple[str, Dict]]:
    """A sweep whose `treatment` lists several arms (sweeps/layouts.yaml) is one comparison per treatment against
    the baseline, named `<sweep>_<treatment>`, with the checks that name no other treatment (a check's own
    `treatment:` keeps it to that arm); a sweep with one treatment is itself."""
    treatments = sweep.get("treatment")
    if not isinstance(treatments, list):
        return [(sweep["name"], sweep)]
    return [(f"{sweep['name']}_{t}", {**sweep, "treatment": t,
                                      "checks": [c for c in sweep.get("checks", []) if c.get("treatment", t) == t]})
            for t in treatments]


def group_sweeps(runs: List[Run], replaced: Dict[str, Run] = None) -> List[Group]:
    """Runs of sweeps/ files: by sweep name, then arm (the knob's value), repeats in repeat order."""
    by_name: Dict[str, Group] = {}
    for run in sorted(runs, key=_order):
        if not run.sweep.get("knob"):
            continue
        value = run.knob(run.sweep["knob"])
        for name, sweep in one_treatment_each(run.sweep):
            role = ("baseline" if value == sweep["baseline"] else "treatment" if value == sweep["treatment"]
                    else str(value))
            group = by_name.setdefault(name, Group(name, sweep, {}))
            group.arms.setdefault(role, Arm(value)).runs.append(run)
            if str(run.path) in (replaced or {}):
                group.replaced[str(run.path)] = replaced[str(run.path)]
    for group in by_name.values():   # baseline, treatment, then the other arms
        order = ["baseline", "treatment"] + sorted(k for k in group.arms if k not in ("baseline", "treatment"))
        group.arms = {k: group.arms[k] for k in order if k in group.arms}
    return [by_name[k] for k in sorted(by_name)]


def flatten(node, prefix: str = "") -> Dict[str, object]:
    out = {}
    for key, value in (node or {}).items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{path}."))
        else:
            out[path] = value
    return out
