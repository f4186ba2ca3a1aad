"""Runs that do not look like their repeats, and stalls inside runs: named, never silently kept or dropped.

The rule (stated in every report): within an arm of MIN_ARM or more finished runs, a run is an outlier
when its steady step time (`step_time_s`, the run's median step) is more than OUTLIER_FACTOR away from
the median of the arm's other runs *and* its modified z-score (Iglewicz & Hoaglin: 0.6745 x the distance
from the arm's median over the median absolute deviation, on log step times) is above MAX_Z. With two
runs nobody can say which one is off, so smaller arms are never judged.

`ablate.sweeps` reruns an outlier once (into `<run dir>_rerun`; the original keeps `rerun_as`, the rerun
`rerun_of`), and the report pairs the rerun in its place. Every check touched by an outlier also shows
the estimate the other way: with the original outlier run instead of its rerun, or without the outlier's
pairs when it was not rerun.
"""
from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Tuple

from ablate.metrics import steady
from ablate.report import runs as R

OUTLIER_FACTOR = 1.5   # beyond the run-to-run spread of a quiet machine (a few %), well inside a loaded one's
MAX_Z = 3.5            # Iglewicz & Hoaglin (1993), "How to Detect and Handle Outliers": |M| > 3.5
MIN_ARM = 3
RULE = (f"Outliers: in an arm of {MIN_ARM}+ runs, a run whose steady step time is over x{OUTLIER_FACTOR:g} away "
        f"from the median of the arm's other runs and whose modified z-score (log step times, MAD) is over "
        f"{MAX_Z:g}; `ablate.sweeps` reruns it once. Stalls: steps over x{steady.STALL_FACTOR:g} the run's median "
        "step (they do not move the run's median-step figures).")


def _modified_z(value: float, values: List[float]) -> float:
    logs = [math.log(v) for v in values]
    centre = statistics.median(logs)
    mad = statistics.median(abs(x - centre) for x in logs)
    distance = abs(math.log(value) - centre)
    if mad == 0:
        return math.inf if distance > 0 else 0.0
    return 0.6745 * distance / mad


def in_arm(runs: List[R.Run]) -> Dict[str, str]:
    """{run path: why it is an outlier} for the runs of one arm."""
    timed = [(r, r.metric("step_time_s")) for r in runs]
    timed = [(r, t) for r, t in timed if t and t > 0]
    if len(timed) < MIN_ARM:
        return {}
    out = {}
    for run, t in timed:
        others = statistics.median(u for r, u in timed if r is not run)
        factor = max(t / others, others / t)
        if factor > OUTLIER_FACTOR and _modified_z(t, [u for _, u in timed]) > MAX_Z:
            side = "slower" if t > others else "faster"
            out[str(run.path)] = (f"steady step {t * 1e3:.3g} ms is x{factor:.2f} {side} than the median of its "
                                  f"arm's other {len(timed) - 1} runs ({others * 1e3:.3g} ms)")
    return out


def find(groups: List[R.Group]) -> Dict[str, str]:
    """{run path: reason} over every arm of these groups (reruns in place of their originals)."""
    out: Dict[str, str] = {}
    for group in groups:
        for arm in group.arms.values():
            out.update(in_arm(arm.runs))
    return out


def alternative(group: R.Group, base: List[R.Run], treat: List[R.Run], flagged: Dict[str, str]
                ) -> Optional[Tuple[str, List[R.Run], List[R.Run]]]:
    """The pairs the other way, when an outlier touches them: (what they are, baseline, treatment)."""
    originals = group.replaced
    if any(str(r.path) in originals for r in base + treat):
        swap = [originals.get(str(r.path), r) for r in base], [originals.get(str(r.path), r) for r in treat]
        return "with the outlier runs instead of their reruns", swap[0], swap[1]
    keep = [i for i, (b, t) in enumerate(zip(base, treat)) if str(b.path) not in flagged
            and str(t.path) not in flagged]
    if len(keep) == len(base):
        return None
    return "without the outlier runs' pairs", [base[i] for i in keep], [treat[i] for i in keep]


def lines(groups: List[R.Group], flagged: Dict[str, str]) -> List[str]:
    """The report's section: every outlier (and its rerun) and every run with a stall."""
    out = []
    for group in groups:
        for original in group.replaced.values():
            rerun = original.summary.get("rerun_as")
            out.append(f"- `{original.path}` ({group.name}): outlier, {original.summary.get('outlier', '')}; "
                       f"rerun as `{rerun}`, which is paired in its place")
        for arm in group.arms.values():
            for run in arm.runs:
                if str(run.path) in flagged:
                    out.append(f"- `{run.path}` ({group.name}, {arm.value}): outlier, {flagged[str(run.path)]}")
                stalls = run.summary.get("stalls") or []
                if stalls:
                    out.append(f"- `{run.path}` ({group.name}, {arm.value}): {steady.describe(stalls)}; "
                               f"its median-step figures leave them out (wall-clock tokens/s "
                               f"{run.summary.get('tokens_per_s_wall', 0):,.0f} vs steady "
                               f"{run.summary.get('tokens_per_s', 0):,.0f})")
    return out


def in_dirs(dirs) -> Dict[str, str]:
    """{run path: reason} for the sweep runs under these directories (reruns in place of their originals)."""
    runs, replaced = R.reruns(R.find(dirs)[0])
    return find(R.group_sweeps(runs, replaced))
