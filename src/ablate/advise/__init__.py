"""`python -m ablate.plan --rank --hardware NAME ...`: the layouts worth running, before running any
(docs/prediction.md, "The advisor").

Every layout of `GRID` is composed with the user's own overrides (theirs for the knobs the grid sets are
replaced), refused ones are counted by their reason, the rest planned: the planned peak per GPU (model/peak.py,
with its GPU allowance) must fit the hardware's memory; what fits is ranked by the predicted tokens/s
(src/ablate/predict), the layouts whose traffic on some dim the comm model leaves out (ZeRO's; a pipelined model
not built in) after those it models whole, each with that dim named. `write_sweep` writes the top k as a sweeps/
file (the layouts.yaml kind: one arm each, the predicted best the baseline) that `python -m ablate.sweeps
--config-dir DIR NAME` runs to confirm the ranking.
"""
from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import yaml

from ablate import parallel, units
from ablate.compose import config_of
from ablate.config import ConfigError
from ablate.model.facts import measure
from ablate.model.peak import plan_peak
from ablate.predict import for_plan
from ablate.predict.fitting import LAYOUT_KNOBS

# the knobs the advisor varies, and the values it tries (the rest stay as the user gave them): the strategy, and
# the layout's knobs (declared in predict/fitting.py, which a job's check reads too)
GRID: Dict[str, Tuple[str, ...]] = {"parallel": ("fsdp2", "hsdp"), **LAYOUT_KNOBS}
ARM_KEYS = {"parallel": "name", "parallel.tp": "tp", "parallel.pp": "pp", "parallel.param_dtype": "param_dtype",
            "model.activation_checkpointing": "activation_checkpointing"}


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def layouts(argv: List[str]) -> Iterator[List[str]]:
    """Each point of the grid: the user's overrides but those of its knobs, then the point's."""
    kept = [o for o in argv if key_of(o) not in GRID]
    for point in itertools.product(*[[f"{k}={v}" for v in values] for k, values in GRID.items()]):
        yield [*kept, *point]


def rank(argv: List[str], hw) -> Tuple[List[Dict[str, object]], Counter]:
    """The layouts that fit, best predicted tokens/s first, and why the others were left out (reason: count)."""
    rows, left_out = [], Counter()
    for overrides in layouts(argv):
        try:
            cfg = config_of(overrides)[1]
            parallel.check(cfg, has_cuda=True)   # what no machine could run is refused as ablate would
            layout = parallel.layout_of(cfg)
            facts = measure(cfg, layout.tp)
            peak = plan_peak(cfg, facts, layout)
        except ConfigError as e:
            left_out[str(e).split(":", 1)[0]] += 1
            continue
        if peak is None or peak.bytes > hw.memory_bytes:
            left_out["does not fit" if peak else "no planned peak"] += 1
            continue
        predicted = for_plan(cfg, layout, sum(facts.numels), facts.blocks.get("count") or 0, hw)
        if predicted.get("step_time_s") is None:
            left_out["not predicted"] += 1
            continue
        rows.append({"overrides": overrides[len(overrides) - len(GRID):], "mesh": layout.record(),
                     "peak_bytes": peak.bytes, **{k: predicted[k] for k in ("tokens_per_s", "mfu", "step_time_s")},
                     # a dim whose traffic the comm model has no figure for counts as none: said beside the rank
                     "not_modelled": [d for d, s in predicted["exposed_comm_s"].items() if s is None]})
    # a prediction that leaves a dim's traffic out is a bound: those come after every fully modelled one
    rows.sort(key=lambda r: (bool(r["not_modelled"]), -r["tokens_per_s"]))
    return rows, left_out


def render(rows: List[Dict[str, object]], left_out: Counter, hw, top: int) -> None:
    from rich.console import Console  # (rich's import: paid by the table only, as ablate.plan's)
    from rich.table import Table

    table = Table(title=f"the layouts that fit {hw.name}, by predicted tokens/s ({len(rows)} fit)")
    for col in ("#", "layout", "mesh (pp x R x S x T)", "tokens/s", "MFU", "step", "peak per GPU", "not modelled"):
        table.add_column(col, justify="left" if col in ("layout", "mesh (pp x R x S x T)") else "right",
                         overflow="fold")
    for i, r in enumerate(rows[:top], 1):
        table.add_row(str(i), arm_name(r["overrides"]), "x".join(str(v) for v in r["mesh"].values()),
                      units.fmt("tokens_per_s", r["tokens_per_s"]), units.fmt("mfu", r["mfu"]),
                      units.fmt("step_time_s", r["step_time_s"]), units.fmt("mem_peak_bytes", r["peak_bytes"]),
                      ", ".join(r["not_modelled"]) or "—")
    console = Console()
    console.print(table)
    console.print("layout: strategy, tp, pp, checkpointing (_ckfull, _cksel), bf16 all-gathers (_bf16ag); left out: "
                  + (", ".join(f"{n} x {why}" for why, n in left_out.most_common()) or "none")
                  + "; predicted as docs/prediction.md says (with a datasheet rate: a bound)")


def arm_name(overrides: List[str]) -> str:
    values = dict(o.split("=", 1) for o in overrides)
    ck = {"false": "", "true": "_ckfull", "selective": "_cksel"}[values["model.activation_checkpointing"]]
    gather = "_bf16ag" if values["parallel.param_dtype"] == "bf16" else ""
    return f"{values['parallel']}_tp{values['parallel.tp']}_pp{values['parallel.pp']}{ck}{gather}"


def arm_values(overrides: List[str]) -> Dict[str, object]:
    return {ARM_KEYS[key_of(o)]: yaml.safe_load(o.split("=", 1)[1]) for o in overrides}


def write_sweep(rows: List[Dict[str, object]], argv: List[str], path: Path) -> None:
    """The top rows as one sweep (see the module's docstring); the user's overrides are every arm's."""
    arms = {arm_name(r["overrides"]): {**arm_values(r["overrides"]),
                                       "predicted_tokens_per_s": r["tokens_per_s"]} for r in rows}
    names = list(arms)
    kept = [o for o in argv if key_of(o) not in GRID and not o.startswith("--")]
    groups = [o for o in kept if "." not in key_of(o)]
    node: Dict[str, object] = {"defaults": [{f"override /{key_of(o)}": o.split("=", 1)[1]} for o in groups]
                               + [{"override /parallel": "fsdp2"}]}   # (each arm names its strategy)
    for o in kept:
        if "." in key_of(o):
            *parents, leaf = key_of(o).split(".")
            target = node
            for part in parents:
                target = target.setdefault(part, {})
            target[leaf] = yaml.safe_load(o.split("=", 1)[1])
    pick = "${sweep.arm_values.${sweep.arm}.%s}"
    node.setdefault("parallel", {}).update({k: pick % k for k in ("name", "tp", "pp", "param_dtype")})
    node.setdefault("model", {})["activation_checkpointing"] = pick % "activation_checkpointing"
    node["hydra"] = {"mode": "MULTIRUN", "sweeper": {"params": {"sweep.repeat": 0, "sweep.arm": ",".join(names)}},
                     "sweep": {"dir": "multirun/${sweep.name}/${now:%Y-%m-%d_%H-%M-%S}"}}
    node["sweep"] = {"repeat": 0, "arm": names[0], "arm_values": arms, "name": path.stem, "claim": path.stem,
                     "technique": "the advisor's top layouts (ablate.plan --rank)", "knob": "sweep.arm",
                     "baseline": names[0], "treatment": names[1:],
                     "claimed_text": "the predicted order of the layouts' tokens/s",
                     "checks": [{"metric": "tokens_per_s", "effect": "ratio", "claimed": None, "expected": "modeled",
                                 "what": "throughput against the predicted best (expected: each run's own "
                                         "prediction, on a GPU; the plan's: arm_values)"}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# @package _global_\n# Written by `python -m ablate.plan --rank --write-sweep`: the top "
                    f"{len(names)} layouts by predicted tokens/s.\n" + yaml.safe_dump(node, sort_keys=False))
