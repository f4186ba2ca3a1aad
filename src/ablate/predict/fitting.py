"""The layout knobs a run can turn to fit a GPU's memory, declared once (the advisor's grid varies them all:
src/ablate/advise), and the best single change that makes a layout fit: each other value of one knob at a time,
the rest as given, kept when its planned peak (model/peak.py, with the GPU allowance) fits the hardware's memory,
ranked by the predicted tokens/s (src/ablate/predict) as the advisor ranks layouts.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Dict, Optional, Tuple

import yaml

from ablate import parallel
from ablate.config import AblateConfig, ConfigError
from ablate.model.facts import measure
from ablate.model.peak import plan_peak
from ablate.predict import for_plan

# the knobs of a layout that move its peak and its speed, and the values tried (as a command line gives them)
LAYOUT_KNOBS: Dict[str, Tuple[str, ...]] = {
    "parallel.tp": ("1", "2", "4", "8"),
    "parallel.pp": ("1", "2", "4"),
    "model.activation_checkpointing": ("false", "selective", "true"),
    "parallel.param_dtype": ("null", "bf16"),
}


def changed(cfg: AblateConfig, *overrides: str) -> AblateConfig:
    """`cfg` with `key=value` overrides set as the command line would (a value read as YAML; a group's key alone sets
    its `name`, as `parallel=hsdp`), every group's checks run again on a copy (`cfg` itself is left as it was)."""
    by_group: Dict[str, Dict[str, object]] = {}
    for override in overrides:
        key, value = override.split("=", 1)
        group, _, leaf = key.partition(".")
        by_group.setdefault(group, {})[leaf or "name"] = yaml.safe_load(value)
    fresh = copy.deepcopy(cfg)
    nodes = {group: dataclasses.replace(getattr(fresh, group), **leaves) for group, leaves in by_group.items()}
    return dataclasses.replace(fresh, **nodes)


def current(cfg: AblateConfig, key: str) -> str:
    group, leaf = key.split(".", 1)
    value = getattr(getattr(cfg, group), leaf)
    return "null" if value is None else str(value).lower()


def planned(cfg: AblateConfig, hw) -> Optional[Dict[str, object]]:
    """The layout's planned peak and predicted speed on `hw`, or None where ablate would refuse it (one line) or
    cannot plan its peak."""
    try:
        parallel.check(cfg, has_cuda=True)   # what no machine could run is refused as ablate would
        layout = parallel.layout_of(cfg)
        facts = measure(cfg, layout.tp)
        peak = plan_peak(cfg, facts, layout)
    except ConfigError:
        return None
    if peak is None:
        return None
    predicted = for_plan(cfg, layout, sum(facts.numels), facts.blocks.get("count") or 0, hw)
    return {"peak_bytes": peak.bytes, "fits": peak.bytes <= hw.memory_bytes,
            "tokens_per_s": predicted.get("tokens_per_s")}


def best_change(cfg: AblateConfig, hw) -> Optional[Dict[str, object]]:
    """The single knob change (`override`) whose layout fits `hw` and predicts the most tokens/s, with its plan;
    None when no single change fits."""
    fitting = []
    for key, values in LAYOUT_KNOBS.items():
        for value in values:
            if value == current(cfg, key):
                continue
            try:
                variant = changed(cfg, f"{key}={value}")
            except (ConfigError, TypeError, ValueError):
                continue
            plan = planned(variant, hw)
            if plan and plan["fits"]:
                fitting.append({"override": f"{key}={value}", **plan})
    fitting.sort(key=lambda p: -(p["tokens_per_s"] or 0.0))
    return fitting[0] if fitting else None
