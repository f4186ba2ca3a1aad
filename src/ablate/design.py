"""Factorial designs for sweeps/ files with `design: factorial` (pyDOE3 generates them).

A sweep's `factors` maps each knob (an override key: `precision`, `parallel.no_sync`) to its levels, the
first being the reference. Without `fraction` the design is the full grid (pyDOE3.fullfact). With
`fraction: "a b c abc"` (pyDOE3's generator syntax: one word per factor, in the factors' order, two
levels each) it is that 2^(k-p) fraction: `resolution` is the shortest word of its defining relation,
and `aliases` lists which effects it cannot tell apart (pyDOE3.fracfact_aliasing).
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from itertools import combinations
from typing import Dict, List, Optional


@dataclass
class Design:
    factors: Dict[str, list]              # knob -> levels (the first is the reference)
    points: List[Dict[str, object]]       # knob -> level, one per cell
    fraction: Optional[str] = None
    resolution: Optional[int] = None      # None: a full grid, nothing aliased
    aliases: List[str] = field(default_factory=list)

    def overrides(self, point: Dict[str, object]) -> List[str]:
        return [f"{knob}={_text(level)}" for knob, level in point.items()]


def _text(level) -> str:
    """A level as the command line writes it (YAML's: null, true)."""
    if level is None:
        return "null"
    return str(level).lower() if isinstance(level, bool) else str(level)


def letters(factors: Dict[str, list]) -> Dict[str, str]:
    """pyDOE3's names for the factors, in order: a, b, c, ..."""
    return dict(zip(string.ascii_lowercase, factors))


def build(factors: Dict[str, list], fraction: Optional[str] = None) -> Design:
    import pyDOE3  # scipy.stats comes with it (2 s): imported when a factorial is planned, not with ablate.sweeps

    knobs = list(factors)
    if len(knobs) < 2 or any(len(levels) < 2 for levels in factors.values()):
        raise ValueError("a factorial design needs two or more factors, each with two or more levels")
    if fraction is None:
        cells = pyDOE3.fullfact([len(factors[k]) for k in knobs])
        points = [{k: factors[k][int(i)] for k, i in zip(knobs, row)} for row in cells]
        return Design(factors, points)
    words = fraction.split()
    if len(words) != len(knobs) or any(len(factors[k]) != 2 for k in knobs):
        raise ValueError(f"fraction '{fraction}' needs one word per factor ({len(knobs)}) and two levels each")
    coded = pyDOE3.fracfact(fraction)
    points = [{k: factors[k][int(x > 0)] for k, x in zip(knobs, row)} for row in coded]
    return Design(factors, points, fraction, resolution(words), list(pyDOE3.fracfact_aliasing(coded)[0]))


def resolution(words: List[str]) -> Optional[int]:
    """The shortest word of the defining relation made by the generators (a generated factor d = abc gives
    the word abcd; products of words cancel letters that appear twice)."""
    base = string.ascii_lowercase[:len(words)]
    generators = [frozenset(w) | {base[i]} for i, w in enumerate(words) if len(w) > 1]
    relation = set()
    for r in range(1, len(generators) + 1):
        for combo in combinations(generators, r):
            word = frozenset()
            for g in combo:
                word = word ^ g
            relation.add(word)
    return min((len(w) for w in relation if w), default=None)


@dataclass
class Arm:
    label: str        # the run's `sweep.arm`
    kind: str         # "cumulative" | "memory" | "leave_one_out"
    step: str         # the step added (cumulative, memory) or left out (leave_one_out); "baseline"
    overrides: List[str]


def stack(node: Dict) -> List[Arm]:
    """A `design: stack` sweep's arms: the baseline, each step added on top of the last (cumulative), the
    memory step on the full stack, and the full stack minus each step (its keys back at the baseline's)."""
    base = dict(o.split("=", 1) for o in node["baseline_overrides"])
    steps = [(s["name"], dict(o.split("=", 1) for o in s["overrides"])) for s in node["steps"]]
    arms, current = [Arm("baseline", "cumulative", "baseline", _as_overrides(base))], dict(base)
    for name, changes in steps:
        current.update(changes)
        arms.append(Arm(f"plus_{name}", "cumulative", name, _as_overrides(current)))
    full = dict(current)
    if node.get("memory_step"):
        memory = node["memory_step"]
        changes = dict(o.split("=", 1) for o in memory["overrides"])
        arms.append(Arm(f"full_{memory['name']}", "memory", memory["name"], _as_overrides({**full, **changes})))
    for name, changes in steps:
        arms.append(Arm(f"minus_{name}", "leave_one_out", name,
                        _as_overrides({**full, **{k: base[k] for k in changes if k in base}})))
    return arms


def _as_overrides(values: Dict[str, str]) -> List[str]:
    return [f"{k}={v}" for k, v in values.items()]
