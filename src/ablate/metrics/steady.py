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


def straggler(per_rank: List[Dict[str, object]], factor: float) -> Optional[Dict[str, object]]:
    """The slowest rank by its work before the collective (by its step time when that is missing), when it
    is over `factor` x the other ranks' median; None otherwise, and with one rank."""
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
    """Each stall with the rank that held it up, when several ranks ran: the one that arrived last, by a stall's
    length, at one of the step's collectives (every rank enters them in the same order; wall clocks, so across
    hosts too: `long_steps`, each rank's long steps' arrival times and seconds blocked in collectives, dropped from
    per_rank here), else the one the others were blocked on (waited_on), else the one that took longest to reach
    the step's first collective (`slowest_before_comm`); its `rank` and `host` added. Then the stalls between
    steps (between_steps), after the steps'."""
    kept = [r.pop("long_steps", None) or [] for r in per_rank]
    gaps = between_steps([r.pop("long_gaps", None) or [] for r in per_rank], per_rank, median, checkpoint_steps)
    arrivals = [{int(s[0]): s[1] for s in steps} for steps in kept]
    blocked = [{int(s[0]): s[2] for s in steps if len(s) > 2 and s[2] is not None} for steps in kept]
    if len(per_rank) < 2:
        return stalls
    out = []
    for stall in stalls:
        late = last_to_arrive(stall, arrivals)
        if late is not None:
            r = per_rank[late[0]]
            out.append({**stall, "rank": r["rank"], "host": r.get("host"), "late_s": late[1]})
            continue
        least = waited_on(stall, blocked)
        if least is not None:
            r = per_rank[least[0]]
            out.append({**stall, "rank": r["rank"], "host": r.get("host"), "others_blocked_s": least[1]})
            continue
        waits = [(dict((int(s), t) for s, t in r.get("slowest_before_comm") or []).get(stall["step"]), r)
                 for r in per_rank]
        known = [(t, r) for t, r in waits if t is not None]
        if known:
            t, r = max(known, key=lambda w: w[0])
            stall = {**stall, "rank": r["rank"], "host": r.get("host"), "before_comm_s": t}
        out.append(stall)
    return out + gaps


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
        if any(t is None for t in times):
            continue
        least = min(range(len(times)), key=lambda r: times[r])
        others = min(t for r, t in enumerate(times) if r != least)
        if others - times[least] > 0.5 * float(stall["seconds"]):
            return least, others
    return None


def checkpointed(every: int, steps: int) -> List[int]:
    """The steps a run checkpoints after (train.checkpoint_every, and the last): their gaps are expected work."""
    return [s for s in range(1, steps + 1) if every and (s % every == 0 or s == steps)]


def between_steps(gaps: List[List[tuple]], per_rank: List[Dict[str, object]], median: Optional[float],
                  checkpoint_steps=()) -> List[Dict[str, object]]:
    """Stalls outside any step: a rank stopped at a log point holds the others up in ablate's own collectives
    there, which no step's time includes. Each gap over STALL_FACTOR x the median step after a step that did not
    checkpoint, where the others spent over half of it in those collectives and one rank did not: that rank, as
    {step (the one before), seconds, x_median, between_steps: true, rank, host, others_blocked_s}."""
    if not median or len(per_rank) < 2:
        return []
    by_step: Dict[int, List[Optional[tuple]]] = {}
    for r, kept in enumerate(gaps):
        for step, seconds, blocked in kept:
            by_step.setdefault(int(step), [None] * len(per_rank))[r] = (seconds, blocked)
    out = []
    for step, per in sorted(by_step.items()):
        longest = max(p[0] for p in per if p)
        if step in checkpoint_steps or longest <= STALL_FACTOR * median or any(p is None for p in per):
            continue
        least = min(range(len(per)), key=lambda r: per[r][1])
        others = min(p[1] for r, p in enumerate(per) if r != least)
        if others - per[least][1] > 0.5 * longest:
            r = per_rank[least]
            out.append({"step": step, "seconds": longest, "x_median": longest / median, "between_steps": True,
                        "rank": r["rank"], "host": r.get("host"), "others_blocked_s": others})
    return out


def describe(stalls: List[Dict[str, float]]) -> str:
    """'2 stalls: step 51 (10.2 s, x204 the median step), step 52 (...)' for a console or report line."""
    if not stalls:
        return ""
    shown = ", ".join(f"step {s['step']} ({s['seconds']:.1f} s, x{s['x_median']:.0f} the median step)"
                      for s in stalls[:3])
    more = f" and {len(stalls) - 3} more" if len(stalls) > 3 else ""
    return f"{len(stalls)} stall(s): {shown}{more}"
