"""Predicted before the run beside measured, per arm (docs/prediction.md): each arm's predicted step - a GPU run's
own (summary.json's `predicted`), or what `ablate.sweeps --predict` wrote for its overrides before any run
(D/predictions.json: `ablate.plan --hardware here` on this machine) - beside the arm's measured steps (median, range,
n), their ratio, and whether the arms rank alike by the two where their measured ranges do not overlap.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional

from ablate import units
from ablate.report import stats
from ablate.report.plan import PLAN_FILE

PREDICTIONS_FILE = "predictions.json"   # an ablate.sweeps --predict call's: overrides -> `predicted`


def key_of(overrides: List[str]) -> str:
    return " ".join(overrides)


@lru_cache(maxsize=None)
def _call(root: Path):
    """(plan, predictions) of the ablate.sweeps call at `root`, or None."""
    try:
        return json.loads((root / PLAN_FILE).read_text()), json.loads((root / PREDICTIONS_FILE).read_text())
    except (OSError, ValueError):
        return None


def of_run(run) -> Optional[float]:
    """The step predicted for this run before it ran: its own, else its sweep call's (its plan's i-th run)."""
    own = (run.summary.get("predicted") or {}).get("step_time_s")
    if own:
        return own
    call, index = _call(run.path.parent.parent), re.match(r"(\d{3})_r\d+_", run.path.name)
    if call is None or index is None or not isinstance(call[0], list) or int(index[1]) > len(call[0]):
        return None
    return (call[1].get(key_of(call[0][int(index[1]) - 1].get("overrides") or [])) or {}).get("step_time_s")


def timed_busy(run) -> bool:
    """The run's own prediction was timed while other processes used the host's CPU (its `host_load`)."""
    return bool(((run.summary.get("predicted") or {}).get("host_load") or {}).get("busy"))


def rows(group) -> Dict[str, Dict[str, object]]:
    out = {}
    for role, arm in group.arms.items():
        predicted = [p for p in map(of_run, arm.runs) if p]
        measured = [m for m in (r.metric("step_time_s") for r in arm.runs) if m]
        if predicted and measured:
            out[role] = {"value": arm.value, "predicted": stats.central(predicted), "measured": measured,
                         "median": stats.central(measured), "busy": sum(map(timed_busy, arm.runs))}
    return out


def agreement(found: Dict[str, Dict[str, object]]) -> str:
    roles, checked, alike = list(found), 0, 0
    for i, a in enumerate(roles):
        for b in roles[i + 1:]:
            ra, rb = found[a], found[b]
            if max(ra["measured"]) < min(rb["measured"]) or max(rb["measured"]) < min(ra["measured"]):
                checked += 1
                alike += (ra["predicted"] < rb["predicted"]) == (ra["median"] < rb["median"])
    return (f"{alike} of {checked} pairs of arms whose measured steps do not overlap rank alike by predicted and by "
            "measured step." if checked else "No two arms' measured steps are apart: no order to compare.")


def section(group) -> List[str]:
    """The group's predicted-vs-measured table, or nothing when no arm has a prediction."""
    found = rows(group)
    if not found:
        return []
    lines = ["", "Predicted before the run (docs/prediction.md) beside measured:", "",
             "| arm | predicted step | measured step: median [min, max] (n) | measured / predicted |",
             "|---|---|---|---|"]
    for role, r in found.items():
        m = r["measured"]
        lines.append(f"| {role} (`{r['value']}`) | {units.fmt('step_time_s', r['predicted'])} | "
                     f"{units.fmt('step_time_s', r['median'])} [{units.fmt('step_time_s', min(m))}, "
                     f"{units.fmt('step_time_s', max(m))}] ({len(m)}) | x{r['median'] / r['predicted']:.3g}"
                     + (f" ({r['busy']} predicted on a busy host)" if r["busy"] else "") + " |")
    return lines + ["", agreement(found)]
