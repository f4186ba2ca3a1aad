"""Runs that are not of a sweeps/ file, compared by what differs in their configs (the knob, inferred): two or more
arms against the first run's, or, when they form a full two-level grid over two or more knobs (a `-m` grid), a
factorial analysis (effects.py).
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional, Tuple

from ablate.report.runs import NOT_A_KNOB, Arm, Group, Run, flatten


def inferred_knobs(runs: List[Run]) -> List[str]:
    """What differs between these runs (the repeat axes and bookkeeping left out): a config group the user
    switched counts once, as `<group>.name` (a 2x2x2 of groups is 3 knobs, not every leaf key they touch);
    any other key that differs, as itself."""
    flat = [flatten(r.config) for r in runs]
    keys = sorted(set().union(*flat)) if flat else []
    differ = [k for k in keys if not k.startswith(NOT_A_KNOB) and len({json.dumps(f.get(k)) for f in flat}) > 1]
    switched = {k.rsplit(".", 1)[0] for k in differ if k.endswith(".name") and k.count(".") == 1}
    return [k for k in differ if k.endswith(".name") or k.split(".", 1)[0] not in switched]


def adhoc_grid(runs: List[Run]) -> Optional[Tuple[Dict[str, list], List[Run]]]:
    """Runs that are not of a sweeps/ file and form a full two-level grid over two or more knobs (a `-m`
    grid): ({factor: [first level, second level]}, runs); the first run's levels are the reference."""
    runs = [r for r in runs if not r.sweep.get("knob") and not r.sweep.get("design")]
    knobs = [k[:-len(".name")] if k.endswith(".name") and k.count(".") == 1 else k for k in inferred_knobs(runs)]
    if len(knobs) < 2:
        return None
    factors = {k: list(dict.fromkeys(json.dumps(r.level(k)) for r in runs)) for k in knobs}
    cells = {tuple(json.dumps(r.level(k)) for k in knobs) for r in runs}
    if any(len(v) != 2 for v in factors.values()) or len(cells) != 2 ** len(knobs):
        return None
    return {k: [json.loads(v) for v in levels] for k, levels in factors.items()}, runs


ADHOC_CHECKS = [
    {"metric": "tokens_per_s", "effect": "ratio", "what": "throughput"},
    {"metric": "mfu", "effect": "difference", "what": "MFU"},
    {"metric": "mfu_common_peak", "effect": "ratio", "what": "MFU against the baseline's peak (a speed ratio)"},
    # the memory verdict: the tensors a knob moves (checkpointing, a strategy, a dtype), measured the same way on any
    # device; the process's peak (CUDA: allocated, CPU: RSS, mostly the runtime's) is the context beside it
    {"metric": "peak_bytes_measured", "effect": "ratio", "what": "peak tensor memory (the memory verdict)"},
    {"metric": "activation_bytes", "effect": "ratio", "what": "activations saved for backward"},
    {"metric": "mem_peak_bytes", "effect": "ratio", "what": "the process's peak memory (CUDA: allocated; CPU: RSS, "
                                                             "mostly the runtime's: a context figure)"},
    {"metric": "data_wait_frac", "effect": "difference", "what": "share of step time waiting for data"},
    {"metric": "comm_bytes_per_step", "effect": "ratio", "exact": True, "what": "communication bytes per step"},
    {"metric": "loss", "effect": "difference", "what": "final loss"},
]


def group_adhoc(runs: List[Run]) -> Optional[Group]:
    """Runs that are not of a sweeps/ file: the knob(s) inferred from their configs; the first run's
    arm is the baseline, the next distinct one the treatment, any others drawn beside them."""
    runs = [r for r in runs if not r.sweep.get("knob") and not r.sweep.get("design")]
    knobs = inferred_knobs(runs)
    if len(runs) < 2 or not knobs or adhoc_grid(runs):   # a full grid gets a factorial analysis instead
        return None
    arms: Dict[str, Arm] = {}
    for run in runs:
        value = ", ".join(f"{k}={run.knob(k)}" for k in knobs)
        arms.setdefault(value, Arm(value)).runs.append(run)
    labels = list(arms)
    roles = {labels[0]: "baseline", **({labels[1]: "treatment"} if len(labels) > 1 else {})}
    sweep = {"name": "compare", "claim": "—", "technique": f"ad-hoc comparison of {', '.join(knobs)}",
             "knob": ", ".join(knobs), "baseline": labels[0], "treatment": labels[1] if len(labels) > 1 else None,
             "claimed_text": "no claim: effects with intervals only", "checks": ADHOC_CHECKS}
    return Group("compare", sweep, {roles.get(k, k): arms[k] for k in labels})
