"""Effects with intervals, and verdicts that say when an effect is only noise.

Repeats are paired (repeat k of the baseline with repeat k of the treatment: interleaved runs, so they
ran next to each other in time). Per check:
- effect kinds: `ratio` (treatment / baseline), `reduction` (1 - treatment / baseline), `difference`
  (treatment - baseline, for fractions), `value_treatment` / `value_baseline` (one arm's level);
- the point estimate is the median of the per-repeat effects;
- the 95% interval is a t-interval: on the log-ratios for ratio and reduction (speed and memory effects
  are multiplicative), on the values themselves otherwise. n = 1 gives no interval;
- `exact` checks (bytes, calls, analytic FLOPs, counts) need no interval when every repeat agrees.

Verdict rule (README, report header): with target T (the expected-here value when ablate can compute
one, else the claim) and tolerance tol, a claim that is `higher`-is-better holds above T - tol, `lower`
below T + tol, `equal` within T +- tol. *reproduced*: the whole interval is on the claimed side;
*not reproduced*: wholly on the other side; *inconclusive*: it straddles (or n = 1);
*not measurable here*: the figure does not exist on this hardware (with the reason). A check without a
claim (the A/A noise sweep, `ablate.report A B`) gets *no claim* and says whether its interval holds
"no change".
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

RATIO_KINDS = ("ratio", "reduction")
NO_CHANGE = {"ratio": 1.0, "reduction": 0.0, "difference": 0.0}
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not measurable here", "no claim")


@dataclass
class Estimate:
    kind: str
    effects: List[float]          # one per pair (or per run for value kinds)
    median: float
    ci_low: Optional[float]
    ci_high: Optional[float]
    n: int
    exact: bool

    @property
    def holds_no_change(self) -> Optional[bool]:
        neutral = NO_CHANGE.get(self.kind)
        if neutral is None or self.ci_low is None:
            return None
        return self.ci_low <= neutral <= self.ci_high


def t_quantile(n: int, level: float = 0.95) -> float:
    """Two-sided Student t quantile for n - 1 degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, n - 1))


def t_interval(values: Sequence[float], level: float = 0.95) -> Tuple[Optional[float], Optional[float]]:
    n = len(values)
    if n < 2:
        return None, None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = t_quantile(n, level) * sd / math.sqrt(n)
    return mean - half, mean + half


def per_pair(kind: str, baseline: Sequence[float], treatment: Sequence[float]) -> Optional[List[float]]:
    """The effect of each (baseline, treatment) pair; None when a ratio has no positive baseline."""
    if kind == "value_treatment":
        return list(treatment)
    if kind == "value_baseline":
        return list(baseline)
    pairs = list(zip(baseline, treatment))
    if kind == "difference":
        return [t - b for b, t in pairs]
    if any(b is None or t is None or b <= 0 or t < 0 for b, t in pairs):
        return None
    ratios = [t / b for b, t in pairs]
    return ratios if kind == "ratio" else [1 - r for r in ratios]


def estimate(kind: str, baseline: Sequence[float], treatment: Sequence[float], exact: bool = False,
             level: float = 0.95) -> Optional[Estimate]:
    effects = per_pair(kind, baseline, treatment)
    if not effects:
        return None
    median = statistics.median(effects)
    if exact and max(effects) - min(effects) <= 1e-9 * max(1.0, abs(median)):
        return Estimate(kind, effects, median, median, median, len(effects), True)
    if kind in RATIO_KINDS and min(effects if kind == "ratio" else [1 - e for e in effects]) > 0:
        ratios = effects if kind == "ratio" else [1 - e for e in effects]
        lo, hi = t_interval([math.log(r) for r in ratios], level)
        if lo is not None:
            lo, hi = math.exp(lo), math.exp(hi)
            if kind == "reduction":
                lo, hi = 1 - hi, 1 - lo
    else:
        lo, hi = t_interval(effects, level)
    return Estimate(kind, effects, median, lo, hi, len(effects), False)


def verdict(target: Optional[float], tolerance: float, better: str, est: Estimate) -> str:
    """One of VERDICTS (except 'not measurable here', which the caller decides) by the module's rule."""
    if target is None:
        return "no claim"
    if est.ci_low is None:
        return "inconclusive"
    lo, hi = est.ci_low, est.ci_high
    if better == "higher":
        threshold = target - tolerance
        return "reproduced" if lo >= threshold else "not reproduced" if hi < threshold else "inconclusive"
    if better == "lower":
        threshold = target + tolerance
        return "reproduced" if hi <= threshold else "not reproduced" if lo > threshold else "inconclusive"
    band = (target - tolerance, target + tolerance)
    if band[0] <= lo and hi <= band[1]:
        return "reproduced"
    return "not reproduced" if hi < band[0] or lo > band[1] else "inconclusive"


def spread(values: Sequence[float]) -> Tuple[Optional[float], Optional[float]]:
    """A 95% t-interval of one arm's mean (error bars in plots); None with one value."""
    return t_interval([v for v in values if v is not None])
