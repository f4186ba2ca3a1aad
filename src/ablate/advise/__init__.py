"""`python -m ablate.plan --rank --hardware NAME ...`: the layouts worth running, before running any
(docs/prediction.md, "The advisor").

Every layout of `GRID` (and, for a pipeline, its micro-batches) is the user's own command changed (composed once;
theirs for the knobs the grid sets are replaced), at the global batch that command trains; refused ones are counted
by their reason, the rest planned: the planned peak per GPU (model/peak.py, with its GPU allowance) must fit the
hardware's memory (a headroom within the plan's own error is marked); what fits is ranked by the predicted tokens/s
(src/ablate/predict), with what bounds its step, the layouts whose traffic on some dim the comm model leaves out
(ZeRO's; a pipelined model not built in) after those it models whole, each with that dim named. `write_sweep`
writes the best k distinct meshes as a sweeps/ file (the layouts.yaml kind: one arm each, the predicted best the
baseline) that `python -m ablate.sweeps --config-dir DIR NAME` runs to confirm the ranking.
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
from ablate.predict.fitting import LAYOUT_KNOBS, changed

# the knobs the advisor varies, and the values it tries (the rest stay as the user gave them): the strategy, and
# the layout's knobs (declared in predict/fitting.py, which a job's check reads too); a pipeline's micro-batches per
# optimizer step, as multiples of its stages (1F1B needs at least as many as stages; more shrink the bubble)
GRID: Dict[str, Tuple[str, ...]] = {"parallel": ("fsdp2", "hsdp"), **LAYOUT_KNOBS}
MICROBATCHES = "parallel.pp_microbatches"
MICROBATCHES_PER_STAGE = (1, 2, 4)
# a mixture of experts' models: expert parallelism too (the degrees dividing its experts)
EP = "parallel.ep"
EP_DEGREES = (1, 2, 4, 8, 16, 32, 64)
ARM_KEYS = {"parallel": "name", "parallel.tp": "tp", "parallel.pp": "pp", "parallel.param_dtype": "param_dtype",
            "model.activation_checkpointing": "activation_checkpointing", MICROBATCHES: "pp_microbatches",
            EP: "ep"}
# a layout whose headroom is within the plan's own error is marked: the plan reads low by up to 12% against
# torchtitan's published peaks (docs/layouts.md, "Against published runs": the allocator's cache it cannot name)
PLAN_LOW_BY = 0.12


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def grid_of(cfg) -> Dict[str, Tuple[str, ...]]:
    """GRID, and for a model with experts the ep degrees that divide them (the world's divide them further: refused
    as ablate would)."""
    moe = getattr(cfg.model, "moe", None) if cfg is not None else None
    if moe is None:
        return GRID
    return {**GRID, EP: tuple(str(e) for e in EP_DEGREES if moe.experts % e == 0)}


def points(cfg=None) -> Iterator[List[str]]:
    """Each point of the grid, as overrides: the knobs' values, and for a pipeline its micro-batches."""
    for point in itertools.product(*[[f"{k}={v}" for v in values] for k, values in grid_of(cfg).items()]):
        pp = int(dict(o.split("=", 1) for o in point)["parallel.pp"])
        for m in ([None] if pp == 1 else [k * pp for k in MICROBATCHES_PER_STAGE]):
            yield [*point, f"{MICROBATCHES}={'null' if m is None else m}"]


def layouts(argv: List[str]) -> Iterator[List[str]]:
    """Each point of the grid with the user's overrides but those of its knobs (the command each layout is)."""
    kept = [o for o in argv if key_of(o) not in (*GRID, MICROBATCHES, EP)]
    for point in points():
        yield [*kept, *point]


def rank(argv: List[str], hw) -> Tuple[List[Dict[str, object]], Counter]:
    """The layouts that fit, best predicted tokens/s first, and why the others were left out (reason: count). Each
    trains the global batch the user's own command does (a fair comparison: a layout's batch per data-parallel rank
    follows from it); the user's command is composed once, each layout is a change of it."""
    base = config_of(next(layouts(argv)))[1]   # (the user's own strategy may not run on this world: parallel=none)
    rows, left_out = [], Counter()
    global_batch = global_batch_of(argv, base)
    for point in points(base):
        try:
            cfg = changed(base, *point, f"train.global_batch_size={global_batch}")
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
        rows.append({**row(point, layout, peak.bytes, hw, predicted), "global_batch": global_batch})
    # a prediction that leaves a dim's traffic out is a bound: those come after every fully modelled one
    rows.sort(key=lambda r: (bool(r["not_modelled"]), -r["tokens_per_s"]))
    return rows, left_out


def global_batch_of(argv: List[str], base) -> int:
    """The sequences per optimizer step the user's command trains: train.global_batch_size, else its batch per rank
    times the data-parallel ranks of its own tp and pp."""
    if base.train.global_batch_size:
        return base.train.global_batch_size
    given = {key_of(o): o.split("=", 1)[1] for o in argv if key_of(o) in ("parallel.tp", "parallel.pp")}
    model_ranks = int(given.get("parallel.tp", 1)) * int(given.get("parallel.pp", 1))
    return base.train.batch_size * base.train.grad_accum * max(1, base.launcher.world_size // model_ranks)


def row(point: List[str], layout, peak_bytes: float, hw, predicted: Dict[str, object]) -> Dict[str, object]:
    headroom = (hw.memory_bytes - peak_bytes) / hw.memory_bytes
    return {"overrides": point, "mesh": layout.record(), "peak_bytes": peak_bytes, "headroom": headroom,
            "tight": headroom < PLAN_LOW_BY, **{k: predicted[k] for k in ("tokens_per_s", "mfu", "step_time_s")},
            "tokens_per_s_per_gpu": predicted["tokens_per_s"] / layout.world, "bound": bound(predicted),
            "rate_source": predicted["rate_source"],
            # a dim whose traffic the comm model has no figure for counts as none: said beside the rank
            "not_modelled": [d for d, s in predicted["exposed_comm_s"].items() if s is None]}


def bound(predicted: Dict[str, object]) -> str:
    """What the step's time is mostly made of, in words: compute (per op class where the machine has per-op
    figures: matmul, attention, memory-bound ops, the optimizer), a pipeline's bubble, or a dim's exposed
    communication, with its share of the step."""
    compute = predicted.get("compute_s_by_class") or {"compute": predicted["compute_s"]}
    parts = {**compute, "bubble": predicted.get("bubble_s") or 0.0,
             **{f"{d} comm": s for d, s in predicted["exposed_comm_s"].items() if s}}
    name, seconds = max(parts.items(), key=lambda p: p[1])
    return f"{name} {seconds / predicted['step_time_s']:.0%}"


def render(rows: List[Dict[str, object]], left_out: Counter, hw, top: int) -> None:
    from rich import box  # (rich's import: paid by the table only, as ablate.plan's)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"layouts that fit {hw.name}, by predicted tokens/s ({len(rows)} fit)", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1))
    for col, justify in (("#", "right"), ("layout", "left"), ("tok/s/GPU", "right"), ("MFU", "right"),
                         ("step", "right"), ("peak", "right"), ("room", "right"), ("bound", "left")):
        table.add_column(col, justify=justify, no_wrap=True)
    for i, r in enumerate(rows[:top], 1):
        room = f"{r['headroom']:.0%}" + ("!" if r["tight"] else "")
        table.add_row(str(i), shown_name(r["overrides"]), compact(r["tokens_per_s_per_gpu"]),
                      f"{r['mfu']:.0%}" if r["mfu"] is not None else "—", f"{r['step_time_s']:.3g} s",
                      units.fmt("mem_peak_bytes", r["peak_bytes"]), room,
                      r["bound"] + (f"; no {', '.join(r['not_modelled'])}" if r["not_modelled"] else ""))
    console = Console(width=max(100, Console().width))
    console.print(table)
    console.print("layout: strategy, tp, pp and its micro-batches (m), checkpointing (sel, full), bf16 all-gathers "
                  "(bf16ag), experts split over ep (ep); ! headroom within the plan's error (12%); the global batch "
                  "of your command for every "
                  "layout; left out: " + (", ".join(f"{n} x {why}" for why, n in left_out.most_common()) or "none"))
    console.print(f"predicted as docs/prediction.md says: {rows[0]['rate_source'] if rows else ''}")


def compact(n: float) -> str:
    """A rate in at most six characters: 1,765, 12.3k, 291M."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e4)):
        if n >= size:
            return f"{n / (size if unit != 'k' else 1e3):.3g}{unit}"
    return f"{n:,.0f}"


def values_of(overrides: List[str]) -> Dict[str, str]:
    return dict(o.split("=", 1) for o in overrides)


def shown_name(overrides: List[str]) -> str:
    """A layout in words that fit a column: `hsdp tp8 pp4 m16 sel bf16ag`, `fsdp2 ep8 full` (tp, pp of one
    rank left out)."""
    v = values_of(overrides)
    parts = [v["parallel"], *(f"{d}{v[f'parallel.{d}']}" for d in ("tp", "pp") if v[f"parallel.{d}"] != "1")]
    parts += [f"m{v[MICROBATCHES]}"] if v.get(MICROBATCHES, "null") != "null" else []
    parts += [f"ep{v[EP]}"] if v.get(EP, "1") != "1" else []
    parts += [{"false": "", "true": "full", "selective": "sel"}[v["model.activation_checkpointing"]]]
    parts += ["bf16ag"] if v["parallel.param_dtype"] == "bf16" else []
    return " ".join(p for p in parts if p)


def arm_name(overrides: List[str]) -> str:
    """A layout as a sweep arm's name: `hsdp_tp8_pp4_m16_cksel_bf16ag`."""
    return "_".join(shown_name(overrides).replace("sel", "cksel").replace("full", "ckfull").split())


def arm_values(overrides: List[str]) -> Dict[str, object]:
    return {ARM_KEYS[key_of(o)]: yaml.safe_load(o.split("=", 1)[1]) for o in overrides}


def distinct_layouts(rows: List[Dict[str, object]], k: int) -> List[Dict[str, object]]:
    """The best k rows whose meshes differ (a sweep of one mesh's checkpointing variants compares no layouts)."""
    out, seen = [], set()
    for r in rows:
        v = values_of(r["overrides"])
        key = (v["parallel"], v["parallel.tp"], v["parallel.pp"], v.get(EP, "1"))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out[:k]


def write_sweep(rows: List[Dict[str, object]], argv: List[str], path: Path) -> None:
    """The rows as one sweep (see the module's docstring); the user's overrides are every arm's."""
    arms = {arm_name(r["overrides"]): {**arm_values(r["overrides"]),
                                       "predicted_tokens_per_s": r["tokens_per_s"]} for r in rows}
    names = list(arms)
    kept = [o for o in argv if key_of(o) not in (*GRID, MICROBATCHES, EP) and not o.startswith("--")]
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
    node.setdefault("train", {})["global_batch_size"] = rows[0]["global_batch"]   # the batch the layouts were ranked at
    pick = "${sweep.arm_values.${sweep.arm}.%s}"
    experts = any(key_of(o) == EP for r in rows for o in r["overrides"])
    node.setdefault("parallel", {}).update({k: pick % k for k in ("name", "tp", "pp", "param_dtype",
                                                                  "pp_microbatches", *(("ep",) if experts else ()))})
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
