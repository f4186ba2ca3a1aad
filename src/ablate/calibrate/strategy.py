"""A strategy's own bookkeeping on this machine, per unit and forward-backward (`python -m ablate.calibrate`'s
`strategy_unit_us`; docs/prediction.md, "Calibrate").

FSDP2's copy-in and copy-out around each gather and reduce-scatter, its hooks, DTensor's sharding rules on every
op of a tensor-parallel block and on the optimizer's step, DDP's bucket hooks, DeepSpeed's engine, a pipeline's
schedule: none of these is an op of the model, and on a CPU they can be as long as the model's own ops. They are
measured on the model's structure shrunk to nothing (its blocks and heads, each matrix a few elements, 8 tokens):
the step with the run's strategy, mesh and ranks on a gloo group, less what the network model charges for the
calls it prices (at the lockstep probe's cost; ZeRO's traffic it leaves out, so its calls stay in the figure),
less the same shrunk model's step on one rank with no strategy, over the units (blocks + the root). What is left
is what the strategy adds per unit, its collectives' own handling included, with nothing of the model's
arithmetic in it. (On torch's fake process group, which runs no collective, the figure missed that handling:
FSDP2 on 2 ranks here read 8 ms a step of it against 19 ms on gloo, and predicted the step 43% short.)
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ablate import parallel
from ablate.compose import config_of
from ablate.config import ModelConfig
from ablate.parallel.comm_model import expected_comm
from ablate.predict import collectives, here
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
    """What the network model charges for a step's calls on the dims it prices (a pipeline's sends; not ZeRO's,
    which it leaves out), at the lockstep probe's cost: on a gloo group they ran, and are not the strategy's."""
    priced = {d for d, b in expected_comm(cfg, parallel.layout_of(cfg), 1).items() if b is not None}
    calls = [c for c in calls if c.dim in priced and c.group > 1]
    if not calls:
        return 0.0
    table = collectives.table(cfg.launcher.nproc_per_node, here.groups_of(calls))
    return sum(collectives.cost(table, c.kind, c.nbytes, c.group, c.after_s) for c in calls)


def unit_seconds(argv: List[str], cfg) -> Optional[Tuple[str, float]]:
    """(key, seconds a unit's forward and backward spend in the strategy's bookkeeping), or None where the run has
    no strategy, spans several nodes (this machine is one), or has a model that is not the built-in Llama's dense
    one (its structure cannot be shrunk by rule). `argv`: the run's overrides (`cfg` composed)."""
    if cfg.parallel.name == "none" or not isinstance(cfg.model, ModelConfig) or cfg.model.moe or \
            cfg.launcher.nodes > 1:
        return None
    small = config_of([*argv, *shrunk(cfg)])[1]
    steps = here.free_steps(small, small.launcher.nproc_per_node, True, local_rank_is)
    with_strategy = max(step[1] for step in steps) - priced_calls(small, steps[0][2])
    own = [a for a in argv if not a.lstrip("+~").startswith(("parallel", "launcher"))]   # its layout's, dropped
    without = here.free_steps(config_of([*own, *shrunk(cfg), *ALONE])[1], 1)[0][1]
    layout = parallel.layout_of(cfg)
    units = cfg.train.grad_accum * cfg.parallel.microbatches * (cfg.model.n_layers / layout.pp + 1)   # as priced
    return strategy_key(cfg.parallel.name, layout.record()), (with_strategy - without) / units
