"""A sweeps/ file's `sweep:` node (sweeps/README.md says what each key means), checked when it is composed: an
unknown key, a comparison without a baseline or treatment, a check without a metric or with an unknown effect
is one line (exit 2) before any run trains, for `python -m ablate.sweeps NAME` and `python -m ablate +sweeps=NAME`
alike. (An arm that overrides a key no config has is refused by the schema when its grid point is composed.)"""
from __future__ import annotations

from typing import Dict, List

from ablate.config.errors import ConfigError

# what a sweep node may hold; `repeat` is on every run's node, the rest come from a sweeps/ file
SWEEP_KEYS = ("repeat", "arm", "name", "claim", "technique", "claimed_text", "knob", "baseline", "treatment",
              "checks", "noise_floor", "design", "factors", "fraction", "steps", "baseline_overrides", "memory_step",
              "metrics", "batch_search", "arm_values")
CHECK_KEYS = ("metric", "effect", "claimed", "tolerance", "better", "exact", "gpu_only", "expected", "note", "what",
              "treatment")
EFFECTS = ("reduction", "ratio", "difference", "value_treatment", "value_baseline")
BETTER = ("higher", "lower", "equal")
DESIGNS = ("factorial", "stack")


# a sweep's batch_search: ablate.maxbatch's options (sweeps/runner.py passes them), each a number >= its least
BATCH_SEARCH = {"multiple_of": 1, "limit": 1, "start": 1, "steps": 2, "mem_budget_gb": 0, "cpu_mem_budget_gb": 0}


def check_batch_search(spec, where: str = "sweep.batch_search") -> None:
    """Every key ablate.maxbatch takes, each a number in range, start <= limit: one line before anything trains."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}={spec!r}: a mapping of {', '.join(BATCH_SEARCH)}")
    for key, value in spec.items():
        if key not in BATCH_SEARCH:
            raise ConfigError(f"{where}.{key}: no such key; valid keys: {', '.join(BATCH_SEARCH)}")
        least, budget = BATCH_SEARCH[key], key.endswith("_gb")
        bad = isinstance(value, bool) or not isinstance(value, (int, float) if budget else int)
        if value is not None and (bad or (value <= least if budget else value < least)):
            allowed = f"a number > {least}" if budget else f"an integer >= {least}"
            raise ConfigError(f"{where}.{key}={value}: out of range; allowed: {allowed}")
    if spec.get("start") and spec.get("limit") and spec["start"] > spec["limit"]:
        raise ConfigError(f"{where}.start={spec['start']}: above {where}.limit={spec['limit']}; nothing to search")


def check_sweep(node: Dict) -> None:
    name = node.get("name", "the sweep")
    unknown = sorted(set(node) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"sweep.{unknown[0]}: no such key in sweep {name}; valid keys: {', '.join(SWEEP_KEYS)}")
    if node.get("design") is not None and node["design"] not in DESIGNS:
        raise ConfigError(f"sweep.design={node['design']}: not a valid choice; valid choices: {', '.join(DESIGNS)}")
    if node.get("knob"):
        for key in ("name", "baseline", "treatment"):
            if node.get(key) is None:
                raise ConfigError(f"sweep.{key}: sweep {name} compares arms of sweep.knob={node['knob']} but names "
                                  f"no {key}; give sweep.{key}")
    elif node.get("checks") and node.get("design") is None:
        raise ConfigError(f"sweep.knob: sweep {name} has checks but no knob to compare its arms by; give sweep.knob, "
                          "sweep.baseline and sweep.treatment")
    _check_checks(node.get("checks") or [], name, _treatments(node))
    if node.get("batch_search") is not None:
        check_batch_search(node["batch_search"])


def _treatments(node: Dict) -> List:
    t = node.get("treatment")
    return t if isinstance(t, list) else [t]


def _check_checks(checks, name: str, treatments: List) -> None:
    if not isinstance(checks, list):
        raise ConfigError(f"sweep.checks: sweep {name}'s checks must be a list of {{metric, effect, ...}}")
    for i, check in enumerate(checks):
        where = f"sweep.checks[{i}]"
        if not isinstance(check, dict) or not check.get("metric"):
            raise ConfigError(f"{where}: sweep {name}'s check names no metric; give {{metric: KEY, effect: KIND}}")
        unknown = sorted(set(check) - set(CHECK_KEYS))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: no such key in a check; valid keys: {', '.join(CHECK_KEYS)}")
        if check.get("effect") not in EFFECTS:
            raise ConfigError(f"{where}.effect={check.get('effect')}: not a valid choice; valid choices: "
                              f"{', '.join(EFFECTS)}")
        if check.get("better") is not None and check["better"] not in BETTER:
            raise ConfigError(f"{where}.better={check['better']}: not a valid choice; valid choices: "
                              f"{', '.join(BETTER)}")
        if "treatment" in check and check["treatment"] not in treatments:
            raise ConfigError(f"{where}.treatment={check['treatment']}: not one of sweep {name}'s treatments "
                              f"({', '.join(map(str, treatments))})")
