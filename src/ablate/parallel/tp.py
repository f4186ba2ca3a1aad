"""parallel.tp > 1: tensor parallelism with torch's parallelize_module over the mesh's `tp` dim (Megatron-LM's
column/row split, Shoeybi et al. 2019; sequence parallelism between the splits, Korthikanti et al. 2022).

The built-in Llama's plan is torchtitan's (torchtitan/models/llama3/infra/parallelize.py, apply_tp): the
embedding split by vocabulary rows with its output sharded on the sequence; in each block the norms run
sequence-parallel, q/k/v and w1/w3 are split by columns (each rank keeps n_heads / tp heads), wo and w2 by rows
(their outputs reduce-scattered back to sequence shards); the head split by columns, its logits left split by
vocabulary for a vocab-parallel loss (parallel.loss_parallel, torch's loss_parallel: each rank keeps 1/tp of the
logits, as torchtitan and Megatron do), or gathered whole (parallel.loss_parallel=false). A user's model
declares its plan in its YAML (`tp_plan`:
{module path pattern: colwise | rowwise | sequence_parallel, with layouts and fused parts}: config/tp_plan.py,
docs/layouts.md); no other model gets tensor parallelism.
"""
from __future__ import annotations

from typing import Dict

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from ablate.config import ModelConfig
from ablate.config.tp_plan import Split
from ablate.parallel.tp_plan import default_input, default_output, resolve

# the layouts a user's plan names (config/tp_plan.py), as placements on the tp dim of a [batch, seq, features] tensor
LAYOUTS = {"replicate": Replicate(), "sequence": Shard(1), "split": Shard(-1)}


def llama_plan(n_layers: int, vocab_parallel: bool, moe: bool = False) -> Dict[str, object]:
    """The built-in Llama's plan (model/llama.py's module names), sequence parallel between the splits; the head's
    logits kept split by vocabulary for a vocab-parallel loss, or gathered whole. A mixture of experts is not split
    (torchtitan's ETP=1 is split by ep instead): its input gathered whole on every tp rank, its output cut back to
    the rank's sequence shard."""
    head = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False) \
        if vocab_parallel else ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    plan: Dict[str, object] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": head,
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
        })
        plan.update(moe_plan(block) if moe else {
            f"{block}.feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                        desired_input_layouts=(Replicate(),)),
            f"{block}.feed_forward.w1": ColwiseParallel(),
            f"{block}.feed_forward.w3": ColwiseParallel(),
            f"{block}.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
    return plan


def moe_plan(block: str) -> Dict[str, object]:
    """A mixture of experts under tensor parallelism: whole on every tp rank, on the whole sequence."""
    return {f"{block}.feed_forward": PrepareModuleInputOutput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
        output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True)}


class FusedColwise(ColwiseParallel):
    """A colwise split of a projection that stacks `parts` along its outputs ([Q|K|V]: 3): each rank keeps its 1/tp
    of every part (rows [Q_r|K_r|V_r]), so that its local output splits into the same parts as the whole one does.
    The rows are reordered part-major -> rank-major before the usual row split; the split weight's global view
    (a checkpoint's) is in that order, which a resume at the same tp reads back as written."""

    def __init__(self, parts: int, **kwargs):
        super().__init__(**kwargs)
        self.parts = parts

    def _partition_linear_fn(self, name, module, device_mesh):
        tp = device_mesh.size()
        for param in list(module.parameters(recurse=False)):
            rows = param.data
            per_rank = rows.view(self.parts, tp, rows.shape[0] // (self.parts * tp), *rows.shape[1:])
            param.data = per_rank.transpose(0, 1).reshape(rows.shape).contiguous()
        super()._partition_linear_fn(name, module, device_mesh)


def user_style(split: Split, module) -> object:
    """One entry of a user's plan as torch's ParallelStyle, on the module it names."""
    if split.style == "sequence_parallel":
        return SequenceParallel(use_local_output=True)   # plain tensors in the user's forward, as around every split
    layouts = {"input_layouts": LAYOUTS[default_input(split, module)], "output_layouts": LAYOUTS[default_output(split)]}
    if split.style == "rowwise":
        return RowwiseParallel(**layouts)
    return FusedColwise(split.fused, **layouts) if split.fused > 1 else ColwiseParallel(**layouts)


def user_plan(net, model_cfg, tp: int) -> Dict[str, object]:
    """A model file's `tp_plan` as parallelize_module takes it: every module it names, by its exact path (checked
    before the run by model/facts.py; the same check here)."""
    return {fqn: user_style(split, net.get_submodule(fqn)) for fqn, split in resolve(net, model_cfg, tp).items()}


def parallelize(model, model_cfg, tp_mesh, vocab_parallel: bool = False) -> None:
    """Split `model`'s layers over `tp_mesh` in place (its network: the contract's `net`). With `vocab_parallel`
    the built-in head leaves its logits split by vocabulary and the model's loss is taken vocab-parallel
    (torch's loss_parallel: each rank's 1/tp of the logits; model.vocab_parallel, read by the strategy)."""
    if isinstance(model_cfg, ModelConfig):
        plan = llama_plan(model_cfg.n_layers, vocab_parallel, model_cfg.moe is not None)
        if vocab_parallel:   # the context the loss's forward and backward run in (TorchStrategy reads it)
            model.loss_context = loss_parallel
    else:
        plan = user_plan(model.net, model_cfg, tp_mesh.size())
    parallelize_module(model.net, tp_mesh, plan)
