"""Today's sweep against a stored baseline: per arm and figure, the change with its 95% interval and a
verdict a CI can act on.

Timed figures (tokens/s, step time, MFU, peak memory) are compared as a ratio today / baseline, by Welch's t
interval on the log scale (the runs of the two sweeps are independent, not paired): *regressed* when the
whole interval is past the threshold on the worse side, *improved* past it on the better side, *unchanged*
inside +-threshold, *inconclusive* otherwise (the interval is wider than the threshold allows: more repeats,
or a quieter host). Exact figures (collective bytes and calls, FLOPs per token) are counts: any change is flagged
*changed*, with which way it moved and whether that is the better way. The false-alarm rate is measured, not
assumed (tests/test_baseline.py: A/A data at n = 3).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ablate import units
from ablate.baseline import EXACT, TIMED

DEFAULT_THRESHOLD = 0.05
VERDICTS = ("regressed", "changed", "improved", "unchanged", "inconclusive", "missing")


@dataclass
class Row:
    arm: str
    metric: str
    baseline: Optional[float]
    today: Optional[float]
    change: Optional[float]        # today / baseline
    ci_low: Optional[float]
    ci_high: Optional[float]
    n_baseline: int
    n_today: int
    verdict: str
    reason: str = ""


def welch_ratio(before: Sequence[float], after: Sequence[float],
                level: float = 0.95) -> Tuple[float, Optional[float], Optional[float]]:
    """(ratio of geometric means after/before, its interval) by Welch's t on the logs; no interval below n = 2."""
    from scipy.stats import t

    a, b = [math.log(v) for v in before], [math.log(v) for v in after]
    ratio = math.exp(statistics.fmean(b) - statistics.fmean(a))
    if len(a) < 2 or len(b) < 2:
        return ratio, None, None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return ratio, ratio, ratio
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(t.ppf(0.5 + level / 2, df)) * se
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)


def verdict(better: str, low: Optional[float], high: Optional[float], threshold: float) -> str:
    if low is None:
        return "inconclusive"
    worse_low, worse_high = (1 - threshold, 1 + threshold)
    if better == "higher":
        if high < worse_low:
            return "regressed"
        if low > worse_high:
            return "improved"
    else:
        if low > worse_high:
            return "regressed"
        if high < worse_low:
            return "improved"
    return "unchanged" if worse_low <= low and high <= worse_high else "inconclusive"


def timed_row(arm: str, metric: str, before: List[float], after: List[float], threshold: float) -> Row:
    ratio, low, high = welch_ratio(before, after)
    judged = verdict(TIMED[metric], low, high, threshold)
    reason = "" if low is not None else "no interval below 2 runs a side: use --repeats 3"
    return Row(arm, metric, statistics.median(before), statistics.median(after), ratio, low, high, len(before),
               len(after), judged, reason)


def exact_row(arm: str, metric: str, before: List[float], after: List[float]) -> Row:
    """A count (bytes, calls, FLOPs per token) changes only when the work does: any change is flagged `changed`
    (the gate fails on it), saying which way it moved and whether that way is the better one."""
    seen_before, seen_after = sorted(set(before)), sorted(set(after))
    same = seen_before == seen_after and len(seen_before) == 1
    change = after[0] / before[0] if before[0] else None
    reason = "" if same else (f"{metric} was {', '.join(f'{v:g}' for v in seen_before)}, now "
                              f"{', '.join(f'{v:g}' for v in seen_after)}{which_way(metric, before[0], after[0])}: "
                              "a count changes only when the work does (save a new baseline if this is meant)")
    return Row(arm, metric, before[0], after[0], change, change, change, len(before), len(after),
               "unchanged" if same else "changed", reason)


def which_way(metric: str, before: float, after: float) -> str:
    """' (down 33%: lower is better)' for a count that moved; the better way as the figure registry declares it."""
    if not before or after == before:
        return ""
    moved = f"{'down' if after < before else 'up'} {abs(after / before - 1):.0%}"
    better = units.FIGURES[metric].better if metric in units.FIGURES else None
    if better is None:
        return f" ({moved})"
    good = (after < before) == (better == "lower")
    return f" ({moved}: {better} is better, so {'an improvement' if good else 'a regression'})"


def values(runs: List[Dict[str, object]], metric: str) -> List[float]:
    return [float(r[metric]) for r in runs if r.get(metric) is not None and (metric in EXACT or r[metric] > 0)]


def compare(baseline: Dict[str, Dict], today: Dict[str, Dict], threshold: float = DEFAULT_THRESHOLD,
            metrics: Sequence[str] = ()) -> List[Row]:
    """Every arm of the baseline and every figure asked (default: all), against today's sweep."""
    wanted = list(metrics) or [*TIMED, *EXACT]
    rows = []
    for arm, kept in baseline.items():
        now = today.get(arm)
        for metric in wanted:
            before = values(kept["runs"], metric)
            after = values(now["runs"], metric) if now else []
            if not before or not after:
                why = "no such arm today" if not now else f"{metric} not recorded on one side"
                rows.append(Row(arm, metric, None, None, None, None, None, len(before), len(after), "missing", why))
            elif metric in EXACT:
                rows.append(exact_row(arm, metric, before, after))
            else:
                rows.append(timed_row(arm, metric, before, after, threshold))
    return rows


def differences(base: Dict[str, object], today: Dict[str, object]) -> List[str]:
    """What differs between the baseline's sweep and today's: commit, versions, host, config keys."""
    out = []
    if base.get("commit") != today.get("commit") or base.get("dirty") or today.get("dirty"):
        mark = lambda e: f"{(e.get('commit') or '?')[:10]}{' (dirty)' if e.get('dirty') else ''}"   # noqa: E731
        out.append(f"commit: {mark(base)} -> {mark(today)}")
    vb, vt = base.get("versions") or {}, today.get("versions") or {}
    out += [f"{k}: {vb.get(k)} -> {vt.get(k)}" for k in sorted(set(vb) | set(vt)) if vb.get(k) != vt.get(k)]
    if base.get("host") != today.get("host"):
        out.append(f"host: {base.get('host')} -> {today.get('host')}")
    for arm, kept in (base.get("arms") or {}).items():
        now = (today.get("arms") or {}).get(arm)
        if not now:
            continue
        cb, ct = kept["config"], now["config"]
        changed = [k for k in sorted(set(cb) | set(ct)) if cb.get(k) != ct.get(k)]
        if changed:
            shown = ", ".join(f"{k}: {cb.get(k)} -> {ct.get(k)}" for k in changed[:4])
            out.append(f"config of `{arm}`: {shown}" + (f" (+{len(changed) - 4} more)" if len(changed) > 4 else ""))
    return out


def as_json(rows: List[Row]) -> List[Dict[str, object]]:
    return [asdict(r) for r in rows]
