"""The peak a rank holds, planned: not the sum of what it keeps, but the most it holds at one moment of the step.

One step is walked through the moments where memory peaks, each the sum of named parts (bytes per rank):
- `loss`: backward begins. The state (parameters, optimizer state; gradients only when earlier micro-steps
  left them: `set_to_none` frees them after every optimizer step), everything forward kept (the activations,
  autocast's low-precision weight copies the matmuls saved), and the loss's gradient: two float32 tensors as wide
  as the vocabulary (the gradient of log-softmax and of the logits: 2 x b x s x V x 4, V / tp under a
  vocab-parallel loss). FSDP: the root's parameters (embedding, final norm, head) all-gathered again, twice
  while the all-gather's buffer is copied out (the larger of that and the loss's gradient). Gradients accumulated
  over micro-batches (grad_accum > 1, a pipeline's micro-batches): the head's new gradient, made apart and then
  added (the larger of it and the loss's gradient: measured, they do not meet), and every gradient held.
- `block i` (backward, last block first): the gradients done so far (FSDP: sharded, after their
  reduce-scatter), what the blocks before i keep, block i's own saved tensors (recomputed first when
  checkpointed) and its weight copies; FSDP: the root's and block i's unsharded parameters, block i-1's
  prefetched, and block i's reduce-scatter (its unsharded gradients, the flat input in the reduce dtype and the
  output shard); accumulating, its largest tensor's new gradient (`accumulation`).
- `end`: the whole state with every gradient, and FSDP's last reduce-scatter (the root's).
(The optimizer's step holds the state alone: AdamW's fused kernel makes no parameter-sized temporaries.)
Every figure is measured on fake tensors (model/facts.py: one sequence's forward) or planned by the strategy
(parallel/*.py plan_bytes); none is fitted to the runs it is checked against (docs/layouts.md: the table).

On a GPU the caching allocator holds more than the tensors: `allowance` (CUDA only) names what comes on top.
What is not modelled: activation gradients in flight between ops (a few b x s x d tensors), tensor parallelism's
gathered sequence (b x s x d per collective), DeepSpeed's own buffers (its bucket sizes), DDP's buckets.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Dict, List, Optional

from ablate import parallel
from ablate.config import AblateConfig, ModelConfig
from ablate.config.schedules import in_flight
from ablate.model import checkpointing
from ablate.model.facts import ModelFacts, kept_per_block, on_tp_rank
from ablate.parallel.mesh import Layout

# On top of the tensors, on a GPU only: the caching allocator's rounding and cache (week-4 C5: fragmentation 2.1%
# with expandable segments on variable-length inputs; fixed-length runs fragment less: 5% rounds it up), and
# memory outside torch's allocator (the CUDA context, ~0.5 GiB on an H100; NCCL's communicators' buffers,
# NCCL_BUFFSIZE 4 MiB per channel and peer: ~0.5 GiB at 8 peers).
ALLOCATOR_SHARE = 0.05
OUTSIDE_TORCH_BYTES = 1 << 30
LOSS_TENSORS = 2    # float32, as wide as the vocabulary, live together in the loss's backward (measured: ablate
                    # runs' step tracker, docs/layouts.md)


@dataclass
class Moment:
    name: str
    parts: Dict[str, float]

    @property
    def total(self) -> float:
        return float(sum(self.parts.values()))


@dataclass
class PeakPlan:
    """The planned peak per rank: `tensors` (the most tensor memory live at once: what a run's step tracker
    measures), the moment and its parts, and `bytes` (tensors + the GPU allowance, when planned for one)."""
    tensors: float
    moment: str
    parts: Dict[str, float]
    allowance: float = 0.0

    @property
    def bytes(self) -> float:
        return self.tensors + self.allowance

    def record(self) -> Dict[str, object]:
        return {"peak_bytes": self.bytes, "peak_tensor_bytes": self.tensors, "peak_moment": self.moment,
                "peak_parts": self.parts, "peak_allowance": self.allowance}


def allowance(tensors: float) -> float:
    return ALLOCATOR_SHARE * tensors + OUTSIDE_TORCH_BYTES


class Walk:
    """The figures one step's moments are made of, per rank (see the module's docstring)."""

    def __init__(self, cfg: AblateConfig, layout: Layout, facts: ModelFacts, held: Optional[float] = None):
        """`held`: under a pipeline, the sequences whose activations the stage holds at once (else the batch); the
        loss's tensors are one micro-batch's."""
        self.cfg, self.layout, saved = cfg, layout, facts.saved
        self.state = parallel.plan_bytes(facts.numels, cfg, layout, facts.split)
        tp_div = layout.tp if isinstance(cfg.model, ModelConfig) else 1   # a user's model was measured as one rank
        mode, micro = cfg.model.activation_checkpointing, cfg.train.batch_size // cfg.parallel.microbatches
        b = held if held is not None else cfg.train.batch_size
        self.mode, self.n = mode, len(saved.by_block)
        self.full = [b * x for x in on_tp_rank(saved, tp_div)]
        self.kept = [b * x for x in kept_per_block(saved, mode, tp_div)]
        vocab_split = layout.tp if layout.tp > 1 and cfg.parallel.vocab_parallel else 1
        self.vocab_saved = (micro if held is not None else b) * saved.vocab_bytes / vocab_split
        # outside the blocks and the vocabulary: the final norm's (the built-in plan splits it by sequence) and the
        # head's input (gathered whole: under-counted by (tp - 1) / tp of b x s x d x 2 bytes)
        self.outside = b * (saved.bytes - sum(saved.by_block) - saved.vocab_bytes) / tp_div
        no_copies = self.fsdp and cfg.parallel.param_dtype is not None   # the blocks compute on gathered bf16
        self.copies = [0.0 if no_copies else x / tp_div for x in saved.copies_by_block]
        self.copies_outside = 0.0 if no_copies else saved.copies_outside / tp_div
        self.loss_grad = LOSS_TENSORS * (micro if held is not None else b) * cfg.train.seq_len * facts.vocab_size * \
            4 / vocab_split if saved.vocab_bytes else 0.0
        self.numel_block, self.numel_root, self.largest = numels_by_block(facts, layout.tp, self.n, layout.ep)

    @property
    def fsdp(self) -> bool:
        return parallel.choice(self.cfg.parallel.name).module == "fsdp2"

    def accumulating(self, index: int, accumulated: bool) -> float:
        """Gradients accumulated over micro-batches: autograd computes each new one apart, then adds it - the
        largest tensor's, in float32, at the backward of the group (block `index`, -1 the root). FSDP: its
        reduce-scatter's buffers hold the group's unsharded gradients already."""
        return 4.0 * self.largest[index] if accumulated and not self.fsdp else 0.0

    def grads_share(self, numel: float) -> float:
        return self.state.grads * numel / (sum(self.numel_block) + self.numel_root)

    def unsharded(self, numel: float) -> float:
        return numel * dtype_bytes(self.cfg.parallel.param_dtype) if self.fsdp else 0.0

    def reduce_scatter(self, numel: float) -> float:
        """FSDP's reduce-scatter of one group: its unsharded gradients, the flat input, the output shard."""
        if not self.fsdp:
            return 0.0
        p, r = dtype_bytes(self.cfg.parallel.param_dtype), dtype_bytes(self.cfg.parallel.reduce_dtype)
        return numel * (p + r) + numel * r / self.layout.dp_shard


def dtype_bytes(name: Optional[str]) -> int:
    """Bytes per element of parallel.param_dtype / reduce_dtype (null: the float32 master weights)."""
    return 2 if name == "bf16" else 4


def numels_by_block(facts: ModelFacts, tp: int, n_blocks: int, ep: int = 1):
    """Per block, and outside the blocks, the parameters one tp rank holds (split ones / tp, a mixture's experts
    / ep), and the largest tensor of each (n_blocks + 1 entries, the root's last)."""
    split = facts.split or [True] * len(facts.numels)
    experts = facts.experts or [False] * len(facts.numels)
    per_block, root, largest = [0.0] * n_blocks, 0.0, [0.0] * (n_blocks + 1)
    for numel, s, e, block in zip(facts.numels, split, experts, facts.param_block or [None] * len(facts.numels)):
        local = (numel / tp if s else float(numel)) / (ep if e else 1)
        if block is None or block >= n_blocks:
            root += local
            largest[-1] = max(largest[-1], local)
        else:
            per_block[block] += local
            largest[block] = max(largest[block], local)
    return per_block, root, largest


def moments(w: Walk, grad_accum: int) -> List[Moment]:
    s = w.state
    base = {"params": s.params, "optimizer": s.optimizer, "grads": s.grads if grad_accum > 1 else 0.0}
    kept_copies = [0.0 if checkpointing.checkpointed(i, w.mode) else w.copies[i] for i in range(w.n)]
    held_all = w.outside + w.vocab_saved + sum(w.kept)
    root = w.unsharded(w.numel_root)
    out = [Moment("loss", {**base, "activations": held_all, "weight_copies": sum(kept_copies) + w.copies_outside,
                           "fsdp_unsharded": root,
                           "loss_grad": max(w.loss_grad, root, w.accumulating(-1, grad_accum > 1))})]
    held_grads = w.grads_share(w.numel_root) if grad_accum == 1 else 0.0
    for i in reversed(range(w.n)):
        held_grads += w.grads_share(w.numel_block[i]) if grad_accum == 1 else 0.0
        before = sum(w.kept[:i])
        own = w.full[i]
        if w.cfg.parallel.reshard_after_forward:   # this block gathered again, and the one before it prefetched
            unsharded = root + w.unsharded(w.numel_block[i]) + (w.unsharded(w.numel_block[i - 1]) if i else 0.0)
        else:                                      # every block kept gathered since forward
            unsharded = root + sum(w.unsharded(x) for x in w.numel_block)
        out.append(Moment(f"block {i}", {**base, "grads": base["grads"] + held_grads,
                                         "activations": w.outside + before + own,
                                         "weight_copies": sum(kept_copies[:i]) + w.copies[i] + w.copies_outside,
                                         "fsdp_unsharded": unsharded,
                                         "fsdp_reduce_scatter": w.reduce_scatter(w.numel_block[i]),
                                         "accumulation": w.accumulating(i, grad_accum > 1)}))
    out.append(Moment("end", {"params": s.params, "optimizer": s.optimizer, "grads": s.grads,
                              "fsdp_reduce_scatter": w.reduce_scatter(w.numel_root)}))
    return out


def by_stage(cfg: AblateConfig, layout: Layout, facts: ModelFacts):
    """Under a pipeline, the first and the last pp rank's share of the model (the most loaded is one of them: the
    first holds the most micro-batches, the last the head and the loss), each with the sequences whose activations
    it holds at once (config/schedules.py)."""
    p = cfg.parallel
    micro = cfg.train.batch_size // p.microbatches
    for rank in sorted({0, p.pp - 1}):
        held = micro * in_flight(p, rank)
        yield stage_share(facts, p.pp, p.pp_stages_per_rank, rank), held


def stage_share(facts: ModelFacts, pp: int, v: int, rank: int) -> ModelFacts:
    """The parameters and saved tensors pp rank `rank` holds: its stages' blocks (stage s on rank s % pp); what
    comes before the blocks (the embedding) on the first rank, what comes after (norm, head, loss) on the last."""
    n = len(facts.saved.by_block)
    per = n // (pp * v)
    owned = [b for s in range(rank, pp * v, pp) for b in range(s * per, (s + 1) * per)]
    first = rank == 0
    last = rank == pp - 1
    blocks = facts.param_block or [None] * len(facts.numels)
    first_block_param = next((i for i, b in enumerate(blocks) if b is not None), len(blocks))
    keep = [i for i, b in enumerate(blocks)
            if (b in owned if b is not None else (first if i < first_block_param else last))]
    renumber = {b: j for j, b in enumerate(owned)}
    saved = copy.copy(facts.saved)
    for name in ("by_block", "block_inputs", "copies_by_block", "kept_by_block"):
        if getattr(saved, name, None) is not None:
            setattr(saved, name, [getattr(facts.saved, name)[b] for b in owned])
    outside = facts.saved.bytes - sum(facts.saved.by_block) - facts.saved.vocab_bytes
    saved.vocab_bytes = facts.saved.vocab_bytes if last else 0
    saved.copies_outside = facts.saved.copies_outside if last else 0
    saved.bytes = sum(saved.by_block) + saved.vocab_bytes + (outside if last else 0)
    return replace(facts, numels=[facts.numels[i] for i in keep],
                   split=[facts.split[i] for i in keep] if facts.split else None, saved=saved,
                   param_block=[renumber.get(blocks[i]) for i in keep])


def plan_peak(cfg: AblateConfig, facts: ModelFacts, layout: Optional[Layout] = None,
              gpu: bool = True) -> Optional[PeakPlan]:
    """The planned peak per rank; None where the model's activations could not be measured (facts.saved)."""
    if facts.saved is None:
        return None
    layout = layout or parallel.layout_of(cfg)
    walks = [Walk(cfg, layout, stage, held) for stage, held in by_stage(cfg, layout, facts)] \
        if layout.pp > 1 else [Walk(cfg, layout, facts)]
    # a pipeline's micro-batches accumulate gradients: from its first backward on, a stage holds all of them
    accumulated = cfg.train.grad_accum if layout.pp == 1 else cfg.parallel.microbatches
    top = max((m for w in walks for m in moments(w, accumulated)), key=lambda m: m.total)
    return PeakPlan(top.total, top.name, {k: v for k, v in top.parts.items() if v},
                    allowance(top.total) if gpu else 0.0)
