"""parallel.tp > 1: tensor parallelism with torch's parallelize_module over the mesh's `tp` dim (Megatron-LM's
column/row split, Shoeybi et al. 2019; sequence parallelism between the splits, Korthikanti et al. 2022).

The built-in Llama's plan is torchtitan's (torchtitan/models/llama3/infra/parallelize.py, apply_tp): the
embedding split by vocabulary rows with its output sharded on the sequence; in each block the norms run
sequence-parallel, q/k/v and w1/w3 are split by columns (each rank keeps n_heads / tp heads), wo and w2 by rows
(their outputs reduce-scattered back to sequence shards); the head split by columns, its logits gathered whole
so that ablate's loss reads them as from one rank. A user's model declares its plan in its YAML (`tp_plan`:
{module path pattern: colwise | rowwise}, docs/layouts.md); no other model gets tensor parallelism.
"""
from __future__ import annotations

from typing import Dict

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ablate.config import ConfigError, ModelConfig

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def llama_plan(n_layers: int) -> Dict[str, object]:
    """The built-in Llama's plan (model/llama.py's module names), sequence parallel between the splits."""
    plan: Dict[str, object] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(n_layers):
        block = f"layers.{i}"
        plan.update({
            f"{block}.attention_norm": SequenceParallel(),
            f"{block}.attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                     desired_input_layouts=(Replicate(), None, None)),
            f"{block}.attention.wq": ColwiseParallel(),
            f"{block}.attention.wk": ColwiseParallel(),
            f"{block}.attention.wv": ColwiseParallel(),
            f"{block}.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            f"{block}.ffn_norm": SequenceParallel(),
            f"{block}.feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                        desired_input_layouts=(Replicate(),)),
            f"{block}.feed_forward.w1": ColwiseParallel(),
            f"{block}.feed_forward.w3": ColwiseParallel(),
            f"{block}.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
    return plan


def user_plan(tp_plan: Dict[str, str]) -> Dict[str, object]:
    """A model file's `tp_plan` as parallelize_module takes it; an unknown style is refused in one line."""
    out = {}
    for pattern, style in tp_plan.items():
        if style not in STYLES:
            raise ConfigError(f"model.tp_plan.{pattern}={style}: not a valid choice; valid choices: "
                              f"{', '.join(STYLES)}")
        out[pattern] = STYLES[style]()
    return out


def parallelize(model, model_cfg, tp_mesh) -> None:
    """Split `model`'s layers over `tp_mesh` in place (its network: the contract's `net`)."""
    plan = llama_plan(model_cfg.n_layers) if isinstance(model_cfg, ModelConfig) else user_plan(model_cfg.tp_plan)
    parallelize_module(model.net, tp_mesh, plan)
