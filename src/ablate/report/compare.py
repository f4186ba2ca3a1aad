"""The report of `python -m ablate.report DIR [DIR ...]` (its command line: cli.py): claimed vs measured, with
repeats, intervals and verdicts.

Reads run directories only (summary.json + config.yaml; runs.py groups them into arms and repeats), and
writes report.md, report.csv and one PNG (+ its data as JSON) per comparison into the first directory.
Runs of sweeps/ files are judged against their claims (stats.py states the rule); any other runs are
compared by the knob(s) their configs differ in, without a claim. Never imports the trainer.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ablate import units
from ablate.report import arithmetic, noise, outliers, plan, sequential, stats, table
from ablate.report import runs as R
from ablate.report.adhoc import group_adhoc
from ablate.report.analyses import ANALYSES
from ablate.report.conditions import busy_note, machine_note, predicted_busy_note

CSV_FIELDS = ("claim", "sweep", "metric", "what", "effect_kind", "claimed", "expected_here", "tolerance",
              "better", "measured", "ci_low", "ci_high", "n", "exact", "verdict", "reason", "baseline",
              "treatment", "baseline_value", "treatment_value", "hardware", "layout", "runs", "outliers", "other_way")
BETTER = {"reduction": "higher", "ratio": "higher"}


@dataclass
class Check:
    claim: str
    sweep: str
    metric: str
    what: str
    effect_kind: str
    claimed: Optional[float]
    expected_here: Optional[float]
    tolerance: float
    better: str
    measured: Optional[float]       # median of the per-repeat effects
    ci_low: Optional[float]
    ci_high: Optional[float]
    n: int
    exact: bool
    verdict: str
    reason: str
    baseline: str
    treatment: str
    baseline_value: Optional[float]   # median over the arm's repeats (raw units; kept even when not measurable)
    treatment_value: Optional[float]
    hardware: str
    layout: str               # the arms' meshes, dp_replicate x dp_shard x tp (baseline -> treatment when they differ)
    runs: str
    outliers: str = ""        # outlier runs among these pairs, or the outliers their reruns replace
    other_way: str = ""       # the estimate and verdict with the outliers the other way (outliers.py)


# "expected here": what the claim predicts for the runs' own shape and scale, where ablate can compute it
EXPECTED: Dict[str, Callable] = {
    # full partitioning leaves 1/world of the replicated state on each rank
    "partition": lambda b, t: 1 - 1 / t[0].summary.get("world_size", 1),
    # the article's 8N rule for this model's shape (full recompute of each block; LM head not checkpointed)
    "full_recompute": lambda b, t: stats.central(x.metric("flops_per_token_full_recompute") for x in t)
    / stats.central(x.metric("flops_per_token") for x in b),
    # hiding all of the baseline's data wait speeds a step up by 1 / (1 - wait share), as far as the
    # treatment's loader keeps up (loader_capacity)
    "hidden_wait": lambda b, t: loader_capacity(b, t)["expected"],
}


def modeled(kind: str, metric: str, base: List[R.Run], treat: List[R.Run]) -> Optional[float]:
    """The effect the runs' own models predict (summary.json's `modeled`: the plan's state bytes, the comm model's
    bytes per mesh dim), in the check's kind; None where a run models none."""
    def model(runs):
        values = [(r.summary.get("modeled") or {}).get(metric) for r in runs]
        return None if not values or any(v is None for v in values) else stats.central(values)
    b, t = model(base), model(treat)
    if kind == "value_treatment":
        return t
    if kind == "value_baseline":
        return b
    if b is None or t is None or not b:
        return None
    return {"ratio": t / b, "reduction": 1 - t / b, "difference": t - b}.get(kind)


def loader_capacity(base: List[R.Run], treat: List[R.Run]) -> Dict[str, float]:
    """C6 at this workload: the treatment's workers deliver at most workers / read latency batches per
    second, and the step, once its wait is hidden, asks for grad_accum batches per (baseline step less its
    wait). The expected speed-up is the baseline step over the longer of that compute time and the
    loader's time per step."""
    step = stats.central(x.metric("step_time_s") for x in base)
    wait = stats.central(x.metric("data_wait_frac") for x in base)
    loader, accum = treat[0].config.get("dataloader", {}), treat[0].config.get("train", {}).get("grad_accum", 1)
    workers, latency_s = loader.get("num_workers") or 0, (loader.get("read_latency_ms") or 0) / 1e3
    compute = step * (1 - wait)
    capacity = workers / latency_s if workers and latency_s else float("inf")
    floor = accum / capacity
    return {"expected": step / max(compute, floor), "capacity": capacity, "demand": accum / compute,
            "workers": workers, "latency_ms": latency_s * 1e3}


def _expected_note(spec: Dict, base: List[R.Run], treat: List[R.Run]) -> str:
    if spec.get("expected") != "hidden_wait":
        return ""
    c = loader_capacity(base, treat)
    if c["capacity"] == float("inf"):
        return "the treatment's loader has no read latency: it keeps up"
    keeps = "keeps up" if c["capacity"] >= c["demand"] else "cannot keep up: the loader bounds the step"
    return (f"loader capacity {c['workers']} workers / {c['latency_ms']:g} ms = {c['capacity']:,.0f} batches/s "
            f"vs {c['demand']:,.0f} batches/s the steps take ({keeps})")


def _not_measurable(spec: Dict, base: List[R.Run], treat: List[R.Run], mixed_ok: bool) -> Optional[str]:
    every = base + treat
    if not base or not treat:
        return "baseline or treatment runs missing"
    hardware = {r.machine for r in every}
    if len(hardware) > 1 and not mixed_ok:
        return f"runs on different hardware ({' vs '.join(sorted(hardware))}): pass --mixed-hardware to pair them"
    if spec.get("gpu_only") and not every[0].on_gpu:
        note = (every[0].summary.get("notes") or {}).get(spec["metric"])
        return note or "a CUDA GPU effect; these runs were on a CPU"
    judged = {"value_treatment": treat, "value_baseline": base}.get(spec["effect"], every)   # one arm's level
    for run in judged:
        invalid = run.invalid(spec["metric"])
        if invalid:
            return f"invalid in {run.path.name}: {invalid}"
    if any(r.metric(spec["metric"]) is None for r in judged):
        missing = next(r for r in judged if r.metric(spec["metric"]) is None)
        return (missing.summary.get("notes") or {}).get(spec["metric"], f"{spec['metric']} was not recorded")
    return None


def _judge(spec: Dict, base: List[R.Run], treat: List[R.Run], claimed, expected, level: float = 0.95):
    """(estimate, verdict) of one check on these pairs; (None, None) when no effect can be computed."""
    kind, metric = spec["effect"], spec["metric"]
    est = stats.estimate(kind, [r.metric(metric) for r in base], [r.metric(metric) for r in treat],
                         exact=bool(spec.get("exact")), level=level)
    if est is None:
        return None, None
    better = spec.get("better", BETTER.get(kind, "equal"))
    target = claimed if expected is None else expected
    return est, stats.verdict(target, float(spec.get("tolerance", 0.05)), better, est) \
        if claimed is not None else "no claim"


def _other_way(group: R.Group, spec: Dict, base, treat, flagged: Dict[str, str], claimed, expected,
               level: float) -> str:
    """The check with the outliers the other way (outliers.alternative), as one phrase."""
    other = outliers.alternative(group, base, treat, flagged)
    if other is None:
        return ""
    what, b, t = other
    est, verdict = _judge(spec, b, t, claimed, expected, level) if b else (None, None)
    if est is None:
        return f"{what}: no pairs left"
    measured = stats.effect_text(est.kind, spec["metric"], est.median, est.ci_low, est.ci_high, est.n,
                                         est.exact)
    return f"{what}: {measured}, {verdict}"


def check(group: R.Group, spec: Dict, mixed_ok: bool = False, flagged: Dict[str, str] = None,
          level: float = 0.95, failures: Dict[str, List] = None) -> Check:
    sweep, metric, kind = group.sweep, spec["metric"], spec["effect"]
    base, treat = group.pairs()
    claimed = None if spec.get("claimed") is None else float(spec["claimed"])
    tolerance, better = float(spec.get("tolerance", 0.05)), spec.get("better", BETTER.get(kind, "equal"))
    reason = _not_measurable(spec, base, treat, mixed_ok)
    failed = (failures or {}).get(sweep.get("name", group.name)) if not base or not treat else None
    if failed:   # an arm has no run because its runs failed: said as such, with where and why
        reason = f"{len(failed)} run(s) failed; {failed[0][0]}: {failed[0][1]}"
    expected = est = None
    if reason is None:
        if spec.get("expected") == "modeled":
            expected = modeled(kind, metric, base, treat)
        elif spec.get("expected") in EXPECTED:
            expected = EXPECTED[spec["expected"]](base, treat)
        est, verdict = _judge(spec, base, treat, claimed, expected, level)
        reason = None if est else f"no {kind} of {metric}: the baseline is 0"
    if est is None:
        verdict = "failed" if failed else "not measurable here"
    else:   # without a claim there is no verdict: what the interval says of the expected value is a reason
        reason = "; ".join(p for p in (_reason(spec, est, verdict, claimed, expected),
                                       _unclaimed_expectation(est, expected, tolerance, better, metric),
                                       _expected_note(spec, base, treat), busy_note(spec, base + treat),
                                       machine_note(spec, base + treat), predicted_busy_note(spec, base + treat))
                                   if p)
    every = base + treat
    return Check(sweep.get("claim", "—"), group.name, metric, spec.get("what", ""), kind, claimed, expected,
                 tolerance, better, est.median if est else None, est.ci_low if est else None,
                 est.ci_high if est else None, est.n if est else len(base), bool(est and est.exact), verdict,
                 reason or "", str(sweep.get("baseline")), str(sweep.get("treatment")),
                 stats.central(r.metric(metric) for r in base), stats.central(r.metric(metric) for r in treat),
                 "; ".join(sorted({r.hardware for r in every})), layouts(base, treat),
                 " ".join(str(r.path) for r in every),
                 " ".join(r.path.name for r in every if str(r.path) in (flagged or {}))
                 + " ".join(group.replaced[str(r.path)].path.name for r in every if str(r.path) in group.replaced),
                 _other_way(group, spec, base, treat, flagged or {}, claimed, expected, level) if est else "")


def collected_checks(group: R.Group) -> List[Dict]:
    """The totals of the runs' own collectors (summary.json's `collected`, metrics.collectors), compared without a
    claim: a ratio where every run's value is positive, else a difference; a figure the sweep checks already, once."""
    base, treat = group.pairs()
    checked = {spec["metric"] for spec in group.sweep.get("checks", [])}
    names = sorted({n for r in base + treat for n in r.summary.get("collected") or []} - checked)
    out = []
    for name in names:
        values = [r.metric(name) for r in base + treat]
        positive = all(v is not None and v > 0 for v in values)
        out.append({"metric": name, "effect": "ratio" if positive else "difference",
                    "what": f"{name} (metrics.collectors)"})
    return out


def layouts(base: List[R.Run], treat: List[R.Run]) -> str:
    """The arms' layouts (runs.Run.layout), "baseline -> treatment" when they differ."""
    a, b = ("/".join(sorted({r.layout for r in arm})) for arm in (base, treat))
    return a if a == b else f"{a} -> {b}"


def _reason(spec, est: stats.Estimate, verdict: str, claimed, expected) -> str:
    parts = [stats.no_interval_text(est)] if stats.no_interval_text(est) else []
    if spec.get("exact") and not est.exact:
        parts.append("an exact figure that varied between repeats")
    if expected is not None and claimed is not None and expected != claimed:
        parts.append(f"judged against {units.effect(est.kind, expected, spec['metric'])} expected here "
                     f"(claimed {units.effect(est.kind, claimed, spec['metric'])} at the article's scale)")
    if verdict == "no claim" and est.holds_no_change is not None:
        parts.append("the interval holds no change" if est.holds_no_change else "the interval excludes no change")
    if verdict in ("not reproduced", "inconclusive") and spec.get("note"):
        parts.append(spec["note"])
    return "; ".join(parts)


UNCLAIMED = {"reproduced": "the interval meets the {e} expected here",
             "not reproduced": "the interval misses the {e} expected here",
             "inconclusive": "the interval cannot tell against the {e} expected here"}


def _unclaimed_expectation(est: stats.Estimate, expected, tolerance: float, better: str, metric: str) -> str:
    """For a check with no claim but a value expected here: what its interval says of that value."""
    if expected is None or est.ci_low is None:
        return ""
    judged = stats.verdict(expected, tolerance, better, est)
    return UNCLAIMED.get(judged, "").format(e=units.effect(est.kind, expected, metric))


@dataclass
class Report:
    """Everything the report shows, found once; every view reads it. `found`: each analysis's items (analyses.py),
    by its key."""
    runs: List[R.Run]
    unfinished: List[Path]
    missing: List[str]
    groups: List[R.Group]
    checks: List[Check]
    outliers: Dict[str, str]
    noise_floor: Optional[Dict[str, object]]
    arithmetic: List[str]
    level: float
    sequential: Optional[Dict[str, object]]
    found: Dict[str, List[Any]]

    def compares_nothing(self) -> bool:
        return not self.checks and not any(self.found.values())


def build(dirs: List[Path], mixed_hardware: bool = False, level: float = 0.95) -> Report:
    """Everything the report shows; `level`: the intervals' confidence (ablate.sweeps --repeats auto
    passes a corrected one, report/sequential.py)."""
    found, unfinished = R.find(dirs)
    runs, replaced = R.reruns(found)
    groups = R.group_sweeps(runs, replaced)
    adhoc = group_adhoc(runs)
    groups += [adhoc] if adhoc else []
    for group in groups:
        R.add_common_peak(group)
    flagged = outliers.find(groups)
    failures = plan.failed(dirs)
    checks = [check(g, spec, mixed_hardware, flagged, level, failures) for g in groups
              for spec in [*g.sweep.get("checks", []), *collected_checks(g)]]
    return Report(runs, unfinished, plan.missing(dirs), groups, checks, flagged, noise.floor(groups, checks, flagged),
                  arithmetic.claims(g.sweep.get("claim") for g in groups) + arithmetic.article_mfu(groups), level,
                  sequential.read(dirs[0]), {a.key: a.find(runs) for a in ANALYSES})


def write_csv(path: Path, checks: List[Check]) -> None:
    table.write(path, CSV_FIELDS, checks)
