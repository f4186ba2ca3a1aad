"""`model.activation_checkpointing`, decoded once (config/models.py `checkpointing_mode`), applied to a model's
blocks here, the built-in Llama's and a user's alike:

- false: none; true: every block recomputed in backward (torch's non-reentrant checkpoint per block);
- an integer k >= 2: every k-th block (blocks 0, k, 2k, ...) recomputed, the rest kept (torchtitan's selective
  per-layer option: most of full checkpointing's memory where k is small, a fraction of its recompute);
- `selective`: per op (torchtitan's default, torchtitan/distributed/activation_checkpoint.py `_apply_op_sac`):
  inside each block the outputs of the compute-heavy ops are kept - matrix multiplications, except every second
  one, and attention - and the rest (norms, activations, rotary embeddings, every second matmul) recomputed,
  through torch's `create_selective_checkpoint_contexts`.
"""
from __future__ import annotations

import functools
from collections import defaultdict
from typing import Callable, List, Union

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

Mode = Union[bool, int, str]

aten = torch.ops.aten
# the ops whose outputs selective checkpointing keeps (torchtitan's _save_list, with the CPU's SDPA kernels)
SAVED_OPS = {aten.mm.default, aten.addmm.default, aten._scaled_dot_product_efficient_attention.default,
             aten._scaled_dot_product_flash_attention.default,
             aten._scaled_dot_product_flash_attention_for_cpu.default, aten.max.default}
MATMULS = {aten.mm.default, aten.addmm.default}


def checkpointed(index: int, mode: Mode) -> bool:
    """Whether block `index` is recomputed in backward (wholly or per op) under `mode`."""
    if mode is True or mode == "selective":
        return True
    return isinstance(mode, int) and not isinstance(mode, bool) and index % mode == 0


def selective_context():
    """torch's selective-checkpoint contexts for one block: keep the SAVED_OPS' outputs but every second matmul's;
    the count is per block call (its forward and its recompute in backward see the same ops in the same order)."""
    meta = defaultdict(int)

    def policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if op in MATMULS:
            meta[f"{mode}_mm"] += 1
        keep = op in SAVED_OPS and not (op in MATMULS and meta[f"{mode}_mm"] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def wrap(forward: Callable, mode: Mode) -> Callable:
    """`forward` recomputed in backward as `mode` says: wholly, or per op (selective)."""
    options = {"use_reentrant": False}
    if mode == "selective":
        options["context_fn"] = selective_context
    return functools.partial(checkpoint, forward, **options)


def apply(blocks: List[torch.nn.Module], mode: Mode) -> int:
    """Wrap the forward of each block `mode` checkpoints; how many."""
    count = 0
    for index, block in enumerate(blocks):
        if checkpointed(index, mode):
            block.forward = wrap(block.forward, mode)
            count += 1
    return count


class KeptBySelective(TorchDispatchMode):
    """`with KeptBySelective(blocks) as kept: model(x)` (a plain forward, fake tensors welcome): per block, the bytes
    of the outputs selective checkpointing would keep (SAVED_OPS, every second matmul dropped): `kept.by_block`,
    what the plan holds for a selectively checkpointed block beside its input (model/facts.py)."""

    def __init__(self, blocks: List[torch.nn.Module]):
        super().__init__()
        self.blocks, self.by_block = blocks, [0] * len(blocks)
        self._current, self._matmuls, self._handles = None, 0, []

    def _enter(self, index: int):
        def hook(module, args):
            self._current, self._matmuls = index, 0
        return hook

    def _leave(self, module, args, output):
        self._current = None

    def __enter__(self):
        for i, block in enumerate(self.blocks):
            self._handles += [block.register_forward_pre_hook(self._enter(i)), block.register_forward_hook(self._leave)]
        return super().__enter__()

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._current is not None and func in SAVED_OPS:
            self._matmuls += func in MATMULS
            if not (func in MATMULS and self._matmuls % 2 == 0):
                tensors = out if isinstance(out, (tuple, list)) else (out,)
                # (a DTensor's own shard: what this rank keeps)
                local = [getattr(t, "_local_tensor", t) for t in tensors if isinstance(t, torch.Tensor)]
                self.by_block[self._current] += sum(t.numel() * t.element_size() for t in local)
        return out
