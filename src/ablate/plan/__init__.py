"""`python -m ablate.plan [overrides]`: static memory per GPU before anything runs.

Three accountings, each named:
- article:  12 bytes/param (fp32 master weights 4 + Adam m 4 + v 4), fully partitioned over the world:
            the week-4 claim "70B: 840 GB -> 13.1 GB per GPU on 64 GPUs".
- zero-paper: the ZeRO paper's mixed-precision total, 16 bytes/param (2 bf16 weights + 2 bf16 grads +
            12 optimizer), partitioned by ZeRO stage (Rajbhandari et al. 2020, sec. 3 and Figure 1).
- ablate:   what ablate's own strategies allocate here (measured equal within 5% by tests/test_parallel.py)
            on the run's layout (parallel/mesh.py: each layer split over tp, then sharded over the strategy's
            shard group), including DeepSpeed's details: an fp32 master partition even in fp32 runs (stages 1-2),
            and ZeRO-3 keeping parameters smaller than stage3_param_persistence_threshold whole.
Activations: what the forward keeps for backward at one micro-batch, measured on fake tensors with the run's
attention and precision, split over tp, with checkpointing's recompute (docs/layouts.md has the model).
Peak: the most a GPU holds at one moment of the step (model/peak.py): the state, the activations, and what
is only there for a while (the loss's gradient, autocast's weight copies, FSDP's unsharded blocks and
reduce-scatters), plus an allowance for the allocator and what lives outside it; the parts of the moment named.
`--json`: the same as one JSON object (bytes per GPU).
GB here = 1e9 bytes, as in the article.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List

from ablate import advise, hardware, parallel, units
from ablate.config import AblateConfig, ConfigError
from ablate.config import arguments as cli
from ablate.config.dims import described
from ablate.model.facts import measure
from ablate.model.peak import by_stage, plan_peak
from ablate.parallel.state_bytes import Breakdown
from ablate.predict import for_plan, here

HERE = "here"   # --hardware here: this machine (a CPU run's step, predicted from measurements here)
NOMINAL_PARAMS = {"1b": 1e9, "8b": 8e9, "70b": 70e9}   # the round numbers the article's arithmetic uses


def article(n_params: float, world: int) -> Breakdown:
    return Breakdown(0.0, 0.0, 12 * n_params / world)


def zero_paper(n_params: float, world: int, stage: int) -> Breakdown:
    """ZeRO paper, mixed precision: weights 2, gradients 2, optimizer states K=12 bytes per parameter."""
    shard = lambda b, from_stage: b * n_params / (world if stage >= from_stage else 1)  # noqa: E731
    return Breakdown(shard(2, 3), shard(2, 2), shard(12, 1))


def plan(cfg: AblateConfig) -> Dict[str, object]:
    layout = parallel.layout_of(cfg)
    facts = measure(cfg, layout.tp)
    numels = facts.numels
    n = sum(numels)
    world = cfg.launcher.world_size
    nominal = NOMINAL_PARAMS.get(cfg.model.name, n)
    stage = parallel.choice(cfg.parallel.name).shards_like_stage
    peak = plan_peak(cfg, facts, layout)
    # a pipeline: the most loaded stage's rank (model/peak.py)
    shares = [share for share, _ in by_stage(cfg, layout, facts)] if layout.pp > 1 and facts.saved else [facts]
    state = max((parallel.plan_bytes(s.numels, cfg, layout, s.split) for s in shares), key=lambda b: b.total)
    return {"model": cfg.model.name, "params": n, "blocks": facts.blocks.get("count") or 0,
            "nominal_params": nominal, "world_size": world,
            "parallel": cfg.parallel.name, "precision": cfg.precision.name, "mesh": layout.record(),
            "article": article(nominal, world), "article_total": 12 * nominal,
            "zero_paper": zero_paper(nominal, world, stage), "zero_paper_total": 16 * nominal,
            "ablate": state, "activation_bytes": facts.activation_bytes,
            "activation_source": facts.activation_source,
            "activation_checkpointing": cfg.model.activation_checkpointing,
            "micro_batch": f"{cfg.train.batch_size} x {cfg.train.seq_len} tokens",
            **(peak.record() if peak else {"peak_bytes": None})}


def fits(p: Dict[str, object], hw) -> Dict[str, object]:
    """Whether the planned peak (with its allowance) fits the memory of one GPU of this hardware."""
    peak = p.get("peak_bytes")
    return {"hardware": hw.record(), "fits": None if peak is None else peak <= hw.memory_bytes,
            "memory_left_bytes": None if peak is None else hw.memory_bytes - peak}


def as_json(p: Dict[str, object]) -> str:
    """The plan as one JSON object: bytes per GPU, each accounting's {params, grads, optimizer, total}."""
    def plain(v):
        return {"params": v.params, "grads": v.grads, "optimizer": v.optimizer, "total": v.total} \
            if isinstance(v, Breakdown) else v
    return json.dumps({k: plain(v) for k, v in p.items()})


def count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:,.4g}{unit}"
    return f"{n:.0f}"


def render(p: Dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    def gb(n: float) -> str:
        return units.fmt("bytes", n) if n else "0"

    mesh = p["mesh"]
    table = Table(title=f"static memory per GPU: model={p['model']} ({count(p['params'])} params), "
                        f"parallel={p['parallel']}, precision={p['precision']}, world={p['world_size']} "
                        f"({described(mesh)})")
    for col in ("accounting", "weights", "gradients", "optimizer", "per GPU", "whole model"):
        table.add_column(col, justify="right" if col != "accounting" else "left")
    nominal = count(p["nominal_params"])
    rows = [(f"article: 12 B/param x {nominal}, fully sharded", p["article"], p["article_total"]),
            (f"ZeRO paper: 16 B/param (2+2+12) x {nominal}", p["zero_paper"], p["zero_paper_total"]),
            (f"ablate {p['parallel']} ({p['precision']}), as allocated", p["ablate"], None)]
    for label, b, whole in rows:
        table.add_row(label, gb(b.params), gb(b.grads), gb(b.optimizer), f"[bold]{gb(b.total)}",
                      gb(whole) if whole else "—")
    console = Console()
    console.print(table)
    recompute = ", activation checkpointing: the blocks' inputs + one block's recompute" \
        if p["activation_checkpointing"] else ""
    if p["activation_bytes"] is None:
        print(f"Activations per GPU: {p['activation_source']}")
        return
    print(f"Activations per GPU: {gb(p['activation_bytes'])} for one micro-batch of {p['micro_batch']} (what the "
          f"forward keeps for backward{recompute}; {p['activation_source']}; docs/layouts.md).")
    parts = ", ".join(f"{k.replace('_', ' ')} {gb(v)}" for k, v in p["peak_parts"].items())
    console.print(f"Peak per GPU: [bold]{gb(p['peak_bytes'])}[/bold] = {gb(p['peak_tensor_bytes'])} of tensors at "
          f"{p['peak_moment']} ({parts}) + {gb(p['peak_allowance'])} allowance (allocator cache, CUDA context, NCCL "
          "buffers); how: docs/layouts.md, \"The peak\".")
    if "hardware" in p:
        hw, left = p["hardware"], p["memory_left_bytes"]
        console.print(f"On {hw['name']} ({gb(hw['memory_bytes'])} per GPU): "
                      + (f"[bold]fits[/bold], {gb(left)} left" if p["fits"] else
                         f"[bold]does not fit[/bold]: {gb(-left)} over"))
    if "predicted" in p:
        render_predicted(console, p["predicted"])


def render_predicted(console, pred: Dict[str, object]) -> None:
    if pred.get("step_time_s") is None:
        console.print(f"Predicted step: none ({pred.get('why')})")
        return
    exposed = ", ".join(f"{d} {units.fmt('step_time_s', s)}" if s is not None else f"{d} not modelled"
                        for d, s in pred["exposed_comm_s"].items()) or "none"
    mfu = f", MFU {units.fmt('mfu', pred['mfu'])}" if pred.get("mfu") is not None else ""
    classes = ", ".join(f"{k} {units.fmt('step_time_s', v)}" for k, v in (pred.get("compute_s_by_class") or {}).items())
    console.print(f"Predicted step: [bold]{units.fmt('step_time_s', pred['step_time_s'])}[/bold], "
                  f"{units.fmt('tokens_per_s', pred['tokens_per_s'])}{mfu} "
                  f"(compute {units.fmt('step_time_s', pred['compute_s'])}{': ' + classes if classes else ''}, "
                  f"exposed communication: {exposed}; "
                  f"{pred['rate_source']}); how: docs/prediction.md.")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ablate.plan", description=__doc__.split("\n\n", 1)[0],
                                epilog="Overrides are those of `python -m ablate`, e.g.: python -m ablate.plan "
                                "model=70b "
                                "parallel=zero3 launcher=slurm precision=bf16",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="the plan as one JSON object (bytes per GPU)")
    p.add_argument("--hardware", metavar="NAME|FILE", default=None,
                   help="the GPU to plan for (conf/hardware: a100_80gb, h100_sxm, h100_pcie, h200, b200; or a YAML "
                        "file of yours): says whether the peak fits its memory, and predicts a step's time, tokens/s "
                        "and MFU there; `here`: this machine's CPU step, from measurements here (docs/prediction.md)")
    p.add_argument("--rank", action="store_true", help="with --hardware: try the layouts of the advisor's grid "
                   "(strategy, tp, pp, checkpointing, bf16 all-gathers), keep those that fit, rank them by "
                   "predicted tokens/s (docs/prediction.md)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="--rank: the layouts shown (10)")
    p.add_argument("--write-sweep", metavar="FILE", default=None,
                   help="--rank: write the top --arms layouts as a sweeps/ file (DIR/sweeps/NAME.yaml runs as "
                        "python -m ablate.sweeps --config-dir DIR NAME)")
    p.add_argument("--arms", type=int, default=3, metavar="K", help="--write-sweep: the layouts it holds (3)")
    p.add_argument("--config-dir", action="append", default=[], metavar="DIR", type=cli.in_dir,
                   help="a config dir of your own (model/, optim/, ... files)")
    p.add_argument("overrides", nargs="*", help="as for python -m ablate")
    return p


def advised(args, argv: List[str]) -> int:
    """--rank: the advisor's ranking (src/ablate/advise), and its sweep file when asked."""
    if args.hardware == HERE:
        raise ConfigError("--rank --hardware here: the advisor ranks layouts on a GPU's figures (conf/hardware: "
                          f"{', '.join(hardware.choices())}, or a file); `here` predicts one layout: drop --rank")
    if not args.hardware:
        raise ConfigError("--rank: give --hardware NAME|FILE (the GPU the layouts must fit and are predicted on)")
    hw = hardware.named(args.hardware)
    rows, left_out = advise.rank(argv, hw)
    if args.json:
        print(json.dumps({"hardware": hw.name, "ranked": rows, "left_out": dict(left_out)}))
    else:
        advise.render(rows, left_out, hw, args.top)
    if args.write_sweep and rows:
        arms = advise.distinct_layouts(rows, args.arms)
        advise.write_sweep(arms, argv, Path(args.write_sweep))
        print(f"sweep: {args.write_sweep} ({len(arms)} layouts)", file=sys.stderr)
    return 0


def main(argv: List[str] = None) -> int:
    """`python -m ablate.plan` (plan/__main__.py exits with what it returns): 0, or a ConfigError's exit code after
    its one line."""
    from ablate.compose import config_of, preflight
    from ablate.config import exit_code_of

    args = parser().parse_args(sys.argv[1:] if argv is None else argv)   # an unknown flag: usage + one line, exit 2
    argv = [*(f"--config-dir={d}" for d in args.config_dir), *args.overrides]
    try:
        # a plan for any machine: nothing here must run it (--rank: the grid's first layout, the user's keys checked)
        preflight(next(advise.layouts(argv)) if args.rank else argv, hardware=False)
        if args.rank:
            return advised(args, argv)
        cfg = config_of(argv)[1]
        p = plan(cfg)
        if args.hardware == HERE:   # this machine: measured here (predict/here.py), not a datasheet
            p["predicted"] = here.predict(cfg)
        elif args.hardware:
            hw = hardware.named(args.hardware)
            p.update(fits(p, hw))
            p["predicted"] = for_plan(cfg, parallel.layout_of(cfg), p["params"], p["blocks"], hw)
        print(as_json(p)) if args.json else render(p)
    except ConfigError as e:
        return exit_code_of(e)
    return 0
