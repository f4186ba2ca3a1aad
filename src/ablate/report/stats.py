"""Effects with intervals, and verdicts that say when an effect is only noise.

Repeats are paired (repeat k of the baseline with repeat k of the treatment: interleaved runs, so they
ran next to each other in time). Per check:
- effect kinds: `ratio` (treatment / baseline), `reduction` (1 - treatment / baseline), `difference`
  (treatment - baseline, for fractions), `value_treatment` / `value_baseline` (one arm's level);
- the point estimate is the median of the per-repeat effects;
- the 95% interval is a t-interval: on the log-ratios for ratio and reduction (speed and memory effects
  are multiplicative, and a ratio's interval never reaches below zero), on the values themselves
  otherwise. n = 1 gives no interval; nor does a log-scale interval wider than a factor MAX_SPAN end to
  end ([x0.016, x48] says nothing): the estimate says "n too small for an interval" and how many repeats
  would give ±10% at the measured spread (`repeats_needed`);
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

from ablate import units


def central(values) -> Optional[float]:
    """An arm's central value, the one definition the arm table, report.csv, the plot data and the PNG read:
    the median (for an even n the mean of the middle two, so two runs show their mean, not the larger one);
    None-valued figures left out, None when nothing is left."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None

RATIO_KINDS = ("ratio", "reduction")
NO_CHANGE = {"ratio": 1.0, "reduction": 0.0, "difference": 0.0}
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not measurable here", "no claim", "failed")
MAX_SPAN = 4.0          # a ratio interval whose high end is over 4x its low end is too wide to print
WANTED_HALF_WIDTH = math.log(1.1)   # repeats_needed aims at ±10% (on the log scale)
MAX_REPEATS = 1000


@dataclass
class Estimate:
    kind: str
    effects: List[float]          # one per pair (or per run for value kinds)
    median: float
    ci_low: Optional[float]
    ci_high: Optional[float]
    n: int
    exact: bool
    too_wide: bool = False              # an interval was computed but is wider than MAX_SPAN: not given
    repeats_needed: Optional[int] = None   # for ±10% at this spread, when too wide

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


def repeats_needed(sd: float, half_width: float = WANTED_HALF_WIDTH, level: float = 0.95) -> Optional[int]:
    """The fewest repeats whose t-interval is at most ±half_width at this standard deviation (None past
    MAX_REPEATS)."""
    for n in range(2, MAX_REPEATS + 1):
        if t_quantile(n, level) * sd / math.sqrt(n) <= half_width:
            return n
    return None


def log_interval(values: Sequence[float], level: float = 0.95) -> Tuple[Optional[float], Optional[float]]:
    """A t-interval of positive values on the log scale (of their geometric mean): never below zero."""
    lo, hi = t_interval([math.log(v) for v in values], level)
    return (None, None) if lo is None else (math.exp(lo), math.exp(hi))


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
        lo, hi = log_interval(ratios, level)
        if lo is not None and hi / lo > MAX_SPAN:   # n too small for an interval at this spread
            needed = repeats_needed(statistics.stdev(math.log(r) for r in ratios), level=level)
            return Estimate(kind, effects, median, None, None, len(effects), False, True, needed)
        if lo is not None and kind == "reduction":
            lo, hi = 1 - hi, 1 - lo
    else:
        lo, hi = t_interval(effects, level)
    return Estimate(kind, effects, median, lo, hi, len(effects), False)


def no_interval_text(est: Estimate) -> str:
    """Why an estimate has no interval, for a reason column."""
    if est.too_wide:
        more = (f"about {est.repeats_needed} repeats would give ±10% at the measured spread"
                if est.repeats_needed else f"over {MAX_REPEATS} repeats would be needed at the measured spread")
        return f"n={est.n} too small for an interval (wider than x{MAX_SPAN:g} end to end): {more}"
    return "one run per arm gives no interval: use --repeats" if est.n == 1 and not est.exact else ""


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


def spread(values: Sequence[float], share: bool = False) -> Tuple[Optional[float], Optional[float]]:
    """A 95% interval of one arm's level (error bars in plots); None with one value. Positive quantities
    (rates, bytes, times) on the log scale (none when wider than MAX_SPAN: n too small), shares on the
    logit scale, so neither leaves its range; other values (a loss, a share that is exactly 0 or 1
    somewhere) get a plain t-interval."""
    values = [v for v in values if v is not None]
    if share and values and all(0 < v < 1 for v in values):
        lo, hi = t_interval([math.log(v / (1 - v)) for v in values])
        return (None, None) if lo is None else (1 / (1 + math.exp(-lo)), 1 / (1 + math.exp(-hi)))
    if not share and values and all(v > 0 for v in values):
        lo, hi = log_interval(values)
        return (None, None) if lo is None or hi / lo > MAX_SPAN else (lo, hi)   # n too small, as for effects
    return t_interval(values)


def effect_text(kind: str, metric: str, value, lo, hi, n: int, exact: bool = False) -> str:
    """'x1.02 [x0.98, x1.05] (n=4)', '−87.5% (exact, n=2)', '— ' for none."""
    if value is None:
        return "—"
    text = units.effect(kind, value, metric)
    if exact:
        return f"{text} (exact, n={n})"
    if lo is None:
        return f"{text} (n={n}, no interval)"
    ends = (hi, lo) if kind == "reduction" else (lo, hi)   # −x% reads low->high
    return f"{text} [{units.effect(kind, ends[0], metric)}, {units.effect(kind, ends[1], metric)}] (n={n})"
