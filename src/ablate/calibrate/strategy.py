"""A strategy's own bookkeeping on this machine, and what a step spends between its ops, per unit and
forward-backward (`python -m ablate.calibrate`'s `strategy_unit_us` and `framework_unit_us`; docs/prediction.md,
"Calibrate").

FSDP2's copy-in and copy-out around each gather and reduce-scatter, its hooks, DTensor's sharding rules on every
op of a tensor-parallel block and on the optimizer's step, DDP's bucket hooks, DeepSpeed's engine, a pipeline's
schedule: none of these is an op of the model, and on a CPU they can be as long as the model's own ops. They are
measured on the model's structure shrunk to nothing (its blocks and heads, each matrix a few elements, 8 tokens):
the step with the run's strategy, mesh and ranks on a gloo group, less what the network model charges for the
calls it prices (at the lockstep probe's cost; a dim it leaves out, ZeRO-3's, keeps its calls in the figure),
less the same shrunk model's step on one rank with no strategy, over the units (blocks + the root). What is left
is what the strategy adds per unit, its collectives' own handling included, with nothing of the model's
arithmetic in it. (On torch's fake process group, which runs no collective, the figure missed that handling:
FSDP2 on 2 ranks here read 8 ms a step of it against 19 ms on gloo, and predicted the step 43% short.) That
shrunk step alone, less what the per-op figures price its ops at (each a launch and autograd's node), is what runs
between the ops (module calls, the loop): the tiny model's 1.80 ms a step, its ops priced at 1.21 ms.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ablate import parallel
from ablate.compose import config_of
from ablate.config import ModelConfig
from ablate.model.facts import measure
from ablate.parallel.comm_model import expected_comm
from ablate.predict import collectives, for_plan, here
from ablate.predict.machine import strategy_key
from ablate.train.ranks import local_rank_is


def shrunk(cfg):
    """Overrides putting the run on its model's structure at a few elements a matrix: its blocks, heads and
    checkpointing kept; its micro-steps, each of one sequence of 8 tokens (a pipeline's: one a micro-batch), so
    that what a strategy does once a step or every micro-step (DDP's reduction with or without no_sync) is done as
    often as in the run."""
    m, tp = cfg.model, cfg.parallel.tp
    return [f"model.dim={2 * m.n_heads}", f"model.ffn_hidden={4 * tp}", f"model.vocab_size={64 * tp}",
            "model.max_seq_len=8", "train.seq_len=8", f"train.grad_accum={cfg.train.grad_accum}",
            "train.global_batch_size=null", f"train.batch_size={cfg.parallel.microbatches}"]


ALONE = ["parallel=none", "launcher.nproc_per_node=1"]   # one rank, no strategy


def priced_calls(cfg, calls) -> float:
    """What the network model charges for a step's calls on the dims it prices (a pipeline's sends; not ZeRO-3's,
    which it leaves out), at the lockstep probe's cost: on a gloo group they ran, and are not the strategy's."""
    priced = {d for d, b in expected_comm(cfg, parallel.layout_of(cfg), 1).items() if b is not None}
    calls = [c for c in calls if c.dim in priced and c.group > 1]
    if not calls:
        return 0.0
    table = collectives.table(cfg.launcher.nproc_per_node, here.groups_of(calls))
    return sum(collectives.cost(table, c.kind, c.nbytes, c.group, c.after_s) for c in calls)


def shrinkable(cfg) -> bool:
    """Whether the run's model can be shrunk by rule (the built-in Llama's dense one) on this one machine."""
    return isinstance(cfg.model, ModelConfig) and not cfg.model.moe and cfg.launcher.nodes == 1


def own_overrides(argv: List[str]) -> List[str]:
    """The run's overrides less its layout's (its parallel and launcher keys)."""
    return [a for a in argv if not a.lstrip("+~").startswith(("parallel", "launcher"))]


def alone_config(argv: List[str], cfg):
    """The run's model shrunk (`shrunk`) on one rank with no strategy."""
    return config_of([*own_overrides(argv), *shrunk(cfg), *ALONE])[1]


def alone_seconds(argv: List[str], cfg) -> float:
    """The shrunk model's step on one rank with no strategy (`argv`: the run's overrides, `cfg` composed)."""
    return here.free_steps(alone_config(argv, cfg), 1)[0][1]


def units_of(cfg) -> float:
    """The forwards and backwards of a unit (a stage's blocks + the root) a step runs, as predict prices them."""
    layout = parallel.layout_of(cfg)
    return cfg.train.grad_accum * cfg.parallel.microbatches * (cfg.model.n_layers / layout.pp + 1)


def unit_seconds(argv: List[str], cfg, without: float) -> Optional[Tuple[str, float]]:
    """(key, seconds a unit's forward and backward spend in the strategy's bookkeeping), or None where the run has
    no strategy or cannot be shrunk. `argv`: the run's overrides (`cfg` composed); `without`: alone_seconds."""
    if cfg.parallel.name == "none" or not shrinkable(cfg):
        return None
    small = config_of([*argv, *shrunk(cfg)])[1]
    steps = here.free_steps(small, small.launcher.nproc_per_node, True, local_rank_is)
    with_strategy = max(step[1] for step in steps) - priced_calls(small, steps[0][2])
    return strategy_key(cfg.parallel.name, parallel.layout_of(cfg).record()), (with_strategy - without) / units_of(cfg)


def framework_unit_seconds(argv: List[str], cfg, without: float, hw) -> float:
    """Seconds a unit's forward and backward spend beyond its ops (module calls, the loop, the loss's and the
    optimizer's Python): the shrunk model's step alone (`without`) less what the machine's per-op figures (`hw`, the
    file being written) price that very step at, over its units. The per-op model prices each op at a launch and
    autograd's node at least; what runs between ops it does not see."""
    small = alone_config(argv, cfg)
    facts = measure(small)
    predicted = for_plan(small, parallel.layout_of(small), sum(facts.numels), facts.blocks.get("count") or 0, hw)
    return (without - predicted["step_time_s"]) / units_of(small)
