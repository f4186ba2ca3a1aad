"""The bytes autograd keeps for backward: what "activation memory" is, counted one way for the plan (a forward on
fake tensors, model/facts.py) and for a run (one real micro-step, summary.json's `activation_bytes`).

Counted: every tensor autograd saves inside the context (torch's saved-tensors hooks), each storage once, its
bytes read when the forward is over, less the weights: a parameter (or FSDP's unsharded copy of one, a leaf that
wants a gradient) and what a cast or a view of one makes (autocast's low-precision copies of the weights are the
weights again, not activations). A DTensor counts its local shard. Attributed to a block too (`by_block`), with
each block's input (`block_inputs`): activation checkpointing keeps those instead of the block's own.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

# autograd nodes that only cast or re-view their input: a saved tensor reached from a parameter through these alone
# is that parameter again (autocast's weight copies, transposed weights)
WEIGHT_VIEWS = ("ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
                "ExpandBackward0", "UnsafeViewBackward0", "AliasBackward0", "_ToCopyBackward0")


def is_weight(t: torch.Tensor) -> bool:
    if t.is_leaf:
        return t.requires_grad
    fn = t.grad_fn
    for _ in range(6):
        if fn is None or type(fn).__name__ not in WEIGHT_VIEWS:
            return False
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return False
        fn = inputs[0]
        if type(fn).__name__ == "AccumulateGrad":
            return True
    return False


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class SavedTensors:
    """`with SavedTensors() as saved: loss = model(x, y)`; then `saved.bytes`, `saved.by_block`, `saved.block_inputs`.
    `blocks`: the model's repeated blocks (model/contract.py), for the per-block figures."""

    def __init__(self, blocks: Optional[List[torch.nn.Module]] = None, vocab: Optional[int] = None):
        self.blocks, self.vocab = blocks or [], vocab
        self._seen: Dict[int, tuple] = {}       # storage key -> (storage, block index or None)
        self._current: Optional[int] = None
        self._inputs: Dict[int, int] = {}
        self._handles = []
        self.bytes = 0
        self._by_vocab: Dict[int, object] = {}
        self.vocab_bytes = 0   # of `bytes`: tensors outside the blocks as wide as the vocabulary (logits, loss)
        self.by_block: List[int] = []
        self.block_inputs: List[int] = []
        self.kept_by_block: List[int] = []   # what selective checkpointing would keep per block (model/facts.py)

    def _pack(self, t: torch.Tensor):
        if not is_weight(t):
            storage = _local(t).untyped_storage()
            self._seen.setdefault(storage._cdata, (storage, self._current))
            if self.vocab and self._current is None and t.dim() and t.shape[-1] == self.vocab:
                self._by_vocab[storage._cdata] = storage   # logits, the loss's: split by a vocab-parallel loss
        return t

    def _enter(self, index: int):
        def hook(module, args):
            self._current = index
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None:
                self._inputs[index] = _local(first).numel() * first.element_size()
        return hook

    def _leave(self, module, args, output):
        self._current = None

    def __enter__(self) -> "SavedTensors":
        for i, block in enumerate(self.blocks):
            self._handles += [block.register_forward_pre_hook(self._enter(i)), block.register_forward_hook(self._leave)]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()
        per_block = [0] * len(self.blocks)
        total = 0
        for storage, block in self._seen.values():   # read now: storages freed during the forward count 0
            n = storage.nbytes()
            total += n
            if block is not None:
                per_block[block] += n
        self.bytes, self.by_block = total, per_block
        self.block_inputs = [self._inputs.get(i, 0) for i in range(len(self.blocks))]
        self.vocab_bytes = sum(storage.nbytes() for storage in self._by_vocab.values())
        self._seen.clear()
        self._by_vocab.clear()

    def checkpointed(self) -> int:
        """The bytes with activation checkpointing of every block: the blocks' inputs instead of their saved
        tensors, plus one block's own while it is recomputed in backward."""
        return self.bytes - sum(self.by_block) + sum(self.block_inputs) + max(self.by_block, default=0)
