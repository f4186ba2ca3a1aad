"""Steady-state speed: a run's speed figures from the median of its steady steps, and its stalls named.

A run's throughput is its tokens per step over its median step time (timing.StepTimes: each measured
step from its first micro-batch to its optimizer step), so a short stall (a paused process, another job
on the cores for a few seconds) moves it little; the wall-clock figures stay beside it. Keys written
to summary.json:
- `step_time_s`: the median steady step; `step_time_p90_s`: its 90th percentile;
- `step_time_mean_s`, `tokens_per_s_wall`: wall time over the measured steps (stalls, log steps and
  checkpoints included);
- `stalls`: every step over STALL_FACTOR x the median, as {step, seconds, x_median}, with several ranks the
  `rank` (and `host`) that held it up (held_up_by), and the gaps between steps the others spent waiting on one
  rank (`between_steps`); `stall_s`: the time the steps took beyond the median;
- `compute_before_comm_s`: the median host time from a step's start to its first collective (data and
  compute before the rank joins the others; DDP's all-reduce evens out step times, this does not). On
  CUDA it is the host's (launch) side; without collectives in a step, the step's time;
- `straggler` (rank 0, from every rank's figures in `per_rank`): the rank whose work before the
  collective is over `metrics.straggler_factor` x the other ranks' median and longer than them by over
  STRAGGLER_MIN_SHARE of a step, as {rank, host, slowdown, seconds, others_s, by}; else null.
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional

STALL_FACTOR = 10.0   # "many times slower than the run's median": past the jitter of a loaded 2-core box (6x seen)
STRAGGLER_MIN_SHARE = 0.05   # a few ms before a collective that is fast anyway is not a straggler


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


def median_or_none(values: List[float]):
    return statistics.median(values) if values else None


def straggler(per_rank: List[Dict[str, object]], factor: float, stage_of=None) -> Optional[Dict[str, object]]:
    """The slowest rank by its work before the collective (by its step time when that is missing), when it
    is over `factor` x the other ranks' median; None otherwise, and with one rank. `stage_of(rank)`: a pipeline's
    stage, whose ranks alone do the same work (a later stage's first send comes after its wait, by design):
    each stage's ranks compared among themselves, the largest slowdown named."""
    if stage_of is not None:
        stages = {}
        for r in per_rank:
            stages.setdefault(stage_of(r["rank"]), []).append(r)
        found = [s for s in (straggler(group, factor) for group in stages.values()) if s]
        return max(found, key=lambda s: s["slowdown"], default=None)
    key = "compute_before_comm_s" if all(r.get("compute_before_comm_s") for r in per_rank) else "step_time_s"
    timed = [r for r in per_rank if r.get(key)]
    if len(timed) < 2:
        return None
    slowest = max(timed, key=lambda r: r[key])
    others = statistics.median(r[key] for r in timed if r is not slowest)
    step = statistics.median(r["step_time_s"] for r in timed if r.get("step_time_s")) if key != "step_time_s" \
        else others
    if others <= 0 or slowest[key] / others <= factor or slowest[key] - others <= STRAGGLER_MIN_SHARE * step:
        return None
    return {"rank": slowest["rank"], "host": slowest.get("host"), "slowdown": slowest[key] / others,
            "seconds": slowest[key], "others_s": others, "by": key}


def held_up_by(stalls: List[Dict[str, object]], per_rank: List[Dict[str, object]], median: Optional[float] = None,
               checkpoint_steps=()) -> List[Dict[str, object]]:
    """Each stall with the rank that held it up, when several ranks ran, by the strongest evidence there is: the one
    rank that was stopped and continued during it (`continued_at`, metrics/stopped.py: `stopped: true`); the one
    that arrived last, by a stall's length, at one of the step's collectives (every rank enters them in the same
    order; wall clocks, so across hosts too: `late_s`); the one the others were blocked on (waited_on); else the
    one that took longest to reach the step's first collective (`slowest_before_comm`); its `rank` and `host`
    added. `long_steps`, `long_gaps` and `continued_at` are dropped from per_rank here (not in summary.json).
    Then the stalls between steps (between_steps), after the steps'."""
    kept = [r.pop("long_steps", None) or [] for r in per_rank]
    continued = [r.pop("continued_at", None) or [] for r in per_rank]
    gaps = between_steps([r.pop("long_gaps", None) or [] for r in per_rank], per_rank, median, checkpoint_steps,
                         continued)
    arrivals = [{int(s[0]): s[1] for s in steps} for steps in kept]
    blocked = [{int(s[0]): s[2] for s in steps if len(s) > 2 and s[2] is not None} for steps in kept]
    windows = [{int(s[0]): (s[3], s[4]) for s in steps if len(s) > 4} for steps in kept]
    if len(per_rank) < 2:
        return stalls
    # a gap beside a stalled step is that stall seen from the stopped rank (the others waited in the step)
    gaps = [g for g in gaps if not any(int(s["step"]) in (g["step"], g["step"] + 1) for s in stalls)]
    return [named(stall, per_rank, arrivals, blocked, windows, continued) for stall in stalls] + gaps


def named(stall, per_rank, arrivals, blocked, windows, continued) -> Dict[str, object]:
    """One stall of a step with the rank that held it up (held_up_by's order of evidence), or as it was."""
    def on(index: int, **why) -> Dict[str, object]:
        r = per_rank[index]
        return {**stall, "rank": r["rank"], "host": r.get("host"), **why}

    step = int(stall["step"])
    stopped = stopped_during([w.get(step) for w in windows], continued)
    if stopped is not None:
        return on(stopped[0], stopped=True, continued_at=stopped[1])
    late = last_to_arrive(stall, arrivals)
    if late is not None:
        return on(late[0], late_s=late[1])
    least = waited_on(stall, blocked)
    if least is not None:
        return on(least[0], others_blocked_s=least[1])
    waits = [dict((int(s), t) for s, t in r.get("slowest_before_comm") or []).get(step) for r in per_rank]
    known = [(t, i) for i, t in enumerate(waits) if t is not None]
    if known:
        t, i = max(known)
        return on(i, before_comm_s=t)
    return stall


def stopped_during(windows: List[Optional[tuple]], continued: List[List[float]]):
    """(index, when) of the one rank continued after a stop within the stall's wall-clock window (the ranks' windows
    together, and a second after: a handler runs once the rank is back in Python), or None (none, or several: job
    control stopped them all)."""
    spans = [w for w in windows if w]
    if not spans:
        return None
    start, end = min(w[0] for w in spans), max(w[1] for w in spans) + 1.0
    hits = [(i, t) for i, times in enumerate(continued) for t in times if start <= t <= end]
    return hits[0] if len({i for i, _ in hits}) == 1 else None


def last_to_arrive(stall: Dict[str, object], arrivals: List[Dict[int, List[float]]]):
    """(index in per_rank, seconds late) of the rank that reached one of the stalled step's collectives last, by
    over half the stall, or None (a rank kept no arrivals of that step, or nobody was that late)."""
    steps = [a.get(int(stall["step"])) for a in arrivals]
    if any(not s for s in steps):
        return None
    spread, _, at = max((max(s[j] for s in steps) - min(s[j] for s in steps), j, max(range(len(steps)),
                                                                                       key=lambda r: steps[r][j]))
                            for j in range(min(len(s) for s in steps)))
    return (at, spread) if spread > 0.5 * float(stall["seconds"]) else None


def waited_on(stall: Dict[str, object], blocked: List[Dict[int, float]]):
    """(index in per_rank, seconds the others were blocked) of the rank the others waited on in the stalled step or
    the next (a rank stopped after it entered a collective arrives on time: the others then wait in it, and it
    does not), when each other rank was blocked over half the stall longer than it; else None."""
    for step in (int(stall["step"]), int(stall["step"]) + 1):
        times = [b.get(step) for b in blocked]
        if all(t is not None for t in times):
            least = blocked_least(times, float(stall["seconds"]))
            if least is not None:
                return least
    return None


def blocked_least(times: List[float], seconds: float):
    """(index, seconds the others were blocked at least) of the one rank blocked over half `seconds` less than
    every other, else None: the rank the others waited on."""
    least = min(range(len(times)), key=lambda r: times[r])
    others = min(t for r, t in enumerate(times) if r != least)
    return (least, others) if others - times[least] > 0.5 * seconds else None


def checkpointed(every: int, steps: int) -> List[int]:
    """The steps a run checkpoints after (train.checkpoint_every, and the last): their gaps are expected work."""
    return [s for s in range(1, steps + 1) if every and (s % every == 0 or s == steps)]


def between_steps(gaps: List[List[tuple]], per_rank: List[Dict[str, object]], median: Optional[float],
                  checkpoint_steps=(), continued: List[List[float]] = ()) -> List[Dict[str, object]]:
    """Stalls outside any step: a rank stopped at a log point, or in its step after its last collective, holds the
    others up in ablate's own collectives there, which no step's time includes. Each gap over STALL_FACTOR x the
    median step after a step that did not checkpoint, where one rank was stopped and continued (`stopped: true`),
    or the others spent over half of it in those collectives and one rank did not: that rank, as {step (the one
    before), seconds, x_median, between_steps: true, rank, host, and its evidence}."""
    if not median or len(per_rank) < 2:
        return []
    by_step: Dict[int, List[Optional[tuple]]] = {}
    for r, kept in enumerate(gaps):
        for step, seconds, blocked, *window in kept:
            by_step.setdefault(int(step), [None] * len(per_rank))[r] = (seconds, blocked, tuple(window) or None)
    out = []
    for step, found in sorted(by_step.items()):
        longest = max(p[0] for p in found if p)
        if step in checkpoint_steps or longest <= STALL_FACTOR * median:
            continue
        # a rank without a long gap there did not wait there (stopped in its step, after its last collective)
        per = [p or (0.0, 0.0, None) for p in found]
        gap = {"step": step, "seconds": longest, "x_median": longest / median, "between_steps": True}
        stopped = stopped_during([p[2] for p in per], continued or [[] for _ in per])
        least = blocked_least([p[1] for p in per], longest)
        if stopped is not None:
            r = per_rank[stopped[0]]
            out.append({**gap, "rank": r["rank"], "host": r.get("host"), "stopped": True, "continued_at": stopped[1]})
        elif least is not None:
            r = per_rank[least[0]]
            out.append({**gap, "rank": r["rank"], "host": r.get("host"), "others_blocked_s": least[1]})
    return out


def describe(stalls: List[Dict[str, float]]) -> str:
    """'2 stalls: step 51 (10.2 s, x204 the median step), step 52 (...)' for a console or report line."""
    if not stalls:
        return ""
    shown = ", ".join(f"step {s['step']} ({s['seconds']:.1f} s, x{s['x_median']:.0f} the median step)"
                      for s in stalls[:3])
    more = f" and {len(stalls) - 3} more" if len(stalls) > 3 else ""
    return f"{len(stalls)} stall(s): {shown}{more}"
