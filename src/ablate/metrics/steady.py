"""Steady-state speed: a run's speed figures from the median of its steady steps, and its stalls named.

A run's throughput is its tokens per step over its median step time (timing.StepTimes: each measured
step from its first micro-batch to its optimizer step), so a short stall (a paused process, another job
on the cores for a few seconds) moves it little; the wall-clock figures stay beside it. Keys written
to summary.json:
- `step_time_s`: the median steady step; `step_time_p90_s`: its 90th percentile;
- `step_time_mean_s`, `tokens_per_s_wall`: wall time over the measured steps (stalls, log steps and
  checkpoints included);
- `stalls`: every step over STALL_FACTOR x the median, as {step, seconds, x_median}; `stall_s`: the
  time they took beyond the median.
"""
from __future__ import annotations

import statistics
from typing import Dict, List

STALL_FACTOR = 5.0   # "many times slower than the run's median": well past step-to-step jitter (<2x here)


def figures(durations: List[List[float]]) -> Dict[str, object]:
    """The median and p90 step time and the stalls of these [step, seconds] pairs (None when empty)."""
    times = sorted(seconds for _, seconds in durations)
    if not times:
        return {"step_time_s": None, "step_time_p90_s": None, "stalls": [], "stall_s": 0.0}
    median = statistics.median(times)
    p90 = statistics.quantiles(times, n=10, method="inclusive")[-1] if len(times) > 1 else times[0]
    stalls = [{"step": int(step), "seconds": seconds, "x_median": seconds / median}
              for step, seconds in durations if median > 0 and seconds > STALL_FACTOR * median]
    return {"step_time_s": median, "step_time_p90_s": p90, "stalls": stalls,
            "stall_s": sum(s["seconds"] - median for s in stalls)}


def describe(stalls: List[Dict[str, float]]) -> str:
    """'2 stalls: step 51 (10.2 s, x204 the median step), step 52 (...)' for a console or report line."""
    if not stalls:
        return ""
    shown = ", ".join(f"step {s['step']} ({s['seconds']:.1f} s, x{s['x_median']:.0f} the median step)"
                      for s in stalls[:3])
    more = f" and {len(stalls) - 3} more" if len(stalls) > 3 else ""
    return f"{len(stalls)} stall(s): {shown}{more}"
