"""The bytes autograd keeps for backward: what "activation memory" is, counted one way for the plan (a forward on
fake tensors, model/facts.py) and for a run (one real micro-step, summary.json's `activation_bytes`).

Counted: every tensor autograd saves inside the context (torch's saved-tensors hooks), each storage once, its
bytes read when the forward is over, less the weights: a parameter (or FSDP's unsharded copy of one, a leaf that
wants a gradient) and what a cast or a view of one makes (autocast's low-precision copies of the weights are the
weights again, not activations). A DTensor counts its local shard. Attributed to a block too (`by_block`), with
each block's input (`block_inputs`): activation checkpointing keeps those instead of the block's own. Of a block's,
what modules each tensor-parallel rank runs whole save (`whole_by_block`: a mixture of experts, whose input is
gathered under tp) is told apart: the rest is split over tp.
The low-precision copies of the weights that autocast makes and the matmuls save are not activations, but they are
held from forward to backward all the same: counted apart (`copies_by_block`, `copies_outside`), for the peak.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

# autograd nodes that only cast or re-view their input: a saved tensor reached from a parameter through these alone
# is that parameter again (autocast's weight copies, transposed weights)
WEIGHT_VIEWS = ("ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0", "PermuteBackward0",
                "ExpandBackward0", "UnsafeViewBackward0", "AliasBackward0", "_ToCopyBackward0",
                "UnbindBackward0", "SelectBackward0")   # (a mixture's stacked experts, one expert's weights each)


CASTS = ("ToCopyBackward0", "_ToCopyBackward0")


def weight_kind(t: torch.Tensor) -> Optional[str]:
    """"weight" (a parameter or a view of one), "copy" (a cast of one: autocast's, its own memory) or None."""
    if t.is_leaf:
        return "weight" if t.requires_grad else None
    fn, kind = t.grad_fn, "weight"
    for _ in range(6):
        if fn is None or type(fn).__name__ not in WEIGHT_VIEWS:
            return None
        kind = "copy" if type(fn).__name__ in CASTS else kind
        inputs = [f for f, _ in fn.next_functions if f is not None]
        if len(inputs) != 1:
            return None
        fn = inputs[0]
        if type(fn).__name__ == "AccumulateGrad":
            return kind
    return None


def is_weight(t: torch.Tensor) -> bool:
    return weight_kind(t) is not None


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class SavedTensors:
    """`with SavedTensors() as saved: loss = model(x, y)`; then `saved.bytes`, `saved.by_block`, `saved.block_inputs`.
    `blocks`: the model's repeated blocks (model/contract.py), for the per-block figures."""

    def __init__(self, blocks: Optional[List[torch.nn.Module]] = None, vocab: Optional[int] = None,
                 whole: Optional[List[torch.nn.Module]] = None):
        self.blocks, self.vocab, self.whole = blocks or [], vocab, whole or []
        self._in_whole = 0
        self._whole_keys: set = set()   # storages saved inside a `whole` module
        self.whole_by_block: List[int] = []
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
        self._copies: Dict[int, tuple] = {}   # storage key -> (storage, block index or None): autocast's casts
        self.copies_by_block: List[int] = []
        self.copies_outside = 0

    def _pack(self, t: torch.Tensor):
        kind = weight_kind(t)
        if kind == "copy":
            storage = _local(t).untyped_storage()
            self._copies.setdefault(storage._cdata, (storage, self._current))
        if kind is None:
            storage = _local(t).untyped_storage()
            self._seen.setdefault(storage._cdata, (storage, self._current))
            if self._in_whole:
                self._whole_keys.add(storage._cdata)
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

    def _whole_in(self, module, args):
        self._in_whole += 1

    def _whole_out(self, module, args, output):
        self._in_whole -= 1

    def __enter__(self) -> "SavedTensors":
        for i, block in enumerate(self.blocks):
            self._handles += [block.register_forward_pre_hook(self._enter(i)), block.register_forward_hook(self._leave)]
        for module in self.whole:
            self._handles += [module.register_forward_pre_hook(self._whole_in),
                              module.register_forward_hook(self._whole_out)]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()
        per_block, whole = [0] * len(self.blocks), [0] * len(self.blocks)
        total = 0
        for key, (storage, block) in self._seen.items():   # read now: storages freed during the forward count 0
            n = storage.nbytes()
            total += n
            if block is not None:
                per_block[block] += n
                whole[block] += n if key in self._whole_keys else 0
        self.bytes, self.by_block, self.whole_by_block = total, per_block, whole
        self.block_inputs = [self._inputs.get(i, 0) for i in range(len(self.blocks))]
        self.vocab_bytes = sum(storage.nbytes() for storage in self._by_vocab.values())
        self.copies_by_block = [0] * len(self.blocks)
        for storage, block in self._copies.values():
            if block is None:
                self.copies_outside += storage.nbytes()
            else:
                self.copies_by_block[block] += storage.nbytes()
        self._seen.clear()
        self._whole_keys.clear()
        self._by_vocab.clear()
        self._copies.clear()

    def repeated(self, n_blocks: int) -> "SavedTensors":
        """These figures, measured on a model of three identical blocks, for the same model with `n_blocks` of them:
        the middle block's repeated (the first and the last differ: the embedding's output is the first's input,
        the final norm saves the last's output), what lies outside the blocks as it is."""
        out = SavedTensors(vocab=self.vocab)

        def grown(per_block: List[int]) -> List[int]:
            return [per_block[0], *[per_block[1]] * (n_blocks - 2), per_block[2]]
        out.by_block, out.block_inputs = grown(self.by_block), grown(self.block_inputs)
        out.kept_by_block, out.copies_by_block = grown(self.kept_by_block), grown(self.copies_by_block)
        out.whole_by_block = grown(self.whole_by_block)
        out.bytes = self.bytes - sum(self.by_block) + sum(out.by_block)
        out.vocab_bytes, out.copies_outside = self.vocab_bytes, self.copies_outside
        return out

    def checkpointed(self) -> int:
        """The bytes with activation checkpointing of every block: the blocks' inputs instead of their saved
        tensors, plus one block's own while it is recomputed in backward."""
        return self.bytes - sum(self.by_block) + sum(self.block_inputs) + max(self.by_block, default=0)
