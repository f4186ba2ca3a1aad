"""What the runs' conditions say about a timing compared in them: a busy host (summary.json's host_load) or a
machine off its calibrated speed (machine_speed) measured the other job or the machine as much as the change.
Exact figures (bytes, calls) do not depend on either: no note for them."""
from __future__ import annotations

from typing import Dict, List

from ablate.report import runs as R


def busy_note(spec: Dict, runs: List[R.Run]) -> str:
    """Runs measured while other processes used the host's CPU (summary.json's host_load): a timing from them
    is noise as much as effect. Exact figures (bytes, calls) do not depend on it."""
    if spec.get("exact"):
        return ""
    busy = [(r.path.name, r.summary["host_load"]["other_cpu_frac"]) for r in runs
            if (r.summary.get("host_load") or {}).get("busy")]
    if not busy:
        return ""
    shown = first_three(f"{name} ({frac:.0%})" for name, frac in busy)
    return (f"{len(busy)}/{len(runs)} runs on a busy host (other processes' share of the CPU: {shown}): "
            "timings there are noise as much as effect")


def predicted_busy_note(spec: Dict, runs: List[R.Run]) -> str:
    """A value expected from the runs' own predictions (`expected: modeled` on a timing), some of them timed while
    other processes used the host's CPU: that expectation measured the other work as much as the arms."""
    if spec.get("exact") or spec.get("expected") != "modeled":
        return ""
    busy = [(r.path.name, r.summary["predicted"]["host_load"]["other_cpu_frac"]) for r in runs
            if ((r.summary.get("predicted") or {}).get("host_load") or {}).get("busy")]
    if not busy:
        return ""
    shown = first_three(f"{name} ({frac:.0%})" for name, frac in busy)
    return (f"{len(busy)}/{len(runs)} runs' predictions timed on a busy host (other processes' share of the CPU: "
            f"{shown}): the value expected here is noise as much as model")


def first_three(names) -> str:
    """'a, b, c ...': the first three runs a note names."""
    names = list(names)
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def machine_note(spec: Dict, runs: List[R.Run]) -> str:
    """Runs whose machine ran more than 10% off its calibration (summary.json's machine_speed: the GEMM probe before
    the first step and after the last): their timings measure the machine as much as the change."""
    if spec.get("exact"):
        return ""
    off = []
    for r in runs:
        speed = r.summary.get("machine_speed") or {}
        if speed.get("off"):
            off.append((r.path.name, max((speed["start_ratio"], speed["end_ratio"]), key=lambda x: abs(x - 1))))
    if not off:
        return ""
    shown = first_three(f"{name} (x{ratio:.2f})" for name, ratio in off)
    return (f"{len(off)}/{len(runs)} runs on a machine more than 10% off its calibrated speed ({shown}): timings "
            "there measure the machine as much as the change")
