"""One rank's compute as the kernels run it: each op of one sequence's forward and backward, recorded on fake
tensors (shapes and dtypes, no memory, no FLOPs spent), priced by its class (docs/prediction.md, "Compute"):

- matmuls (mm, addmm, bmm, a grouped or scaled mm): the roofline of the op, max(FLOPs / the achieved matmul rate,
  bytes / the achieved memory bandwidth);
- attention (SDPA's fused kernels, forward and backward): the FLOPs the kernel executes (FlashAttention's
  convention: 4 b h s s' d forward, halved under a causal mask; backward 2.5x the forward) / the achieved attention
  rate;
- every other op that launches a kernel (norms, rotary, activations, residual adds, casts, the loss, the
  embedding): memory-bound, the bytes it reads and writes / the achieved memory bandwidth;
- each op takes at least the machine's per-kernel time (a launch);
- where the machine measured an op at the very shapes, dtypes and strides this rank runs it (`ablate.calibrate`
  replays each op of the model it is given: its hardware file's `op_us`, keyed by `signature`), that time instead.
Activation checkpointing's recompute is in the record: backward runs the checkpointed forward again, as the run
does. Recorded once per model, sequence, precision and checkpointing (the advisor's layouts differ in their
batch and their tp share, by which a sequence's figures are scaled: an op's FLOPs and bytes by the sequences and
1/tp, the launches not). The built-in Llama is recorded with one and two blocks (its blocks are identical, so
a block is their difference), any other model whole.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Dict, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ablate.config import ModelConfig
from ablate.model import build
from ablate.model.facts import computing_as_run, on_fake_or_meta

MATMULS = {"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "_scaled_mm", "_scaled_grouped_mm"}
ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention")   # SDPA's kernels, either direction
# ops that launch no kernel: shape, alias and allocation bookkeeping
NO_KERNEL = {"_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
             "alias", "detach", "_reshape_alias"}
BACKWARD_OVER_FORWARD = 2.5   # FlashAttention's count: 5 matmuls backward (one the forward's, recomputed) to 2

# (matmul | attention | memory, FLOPs executed, bytes read and written, the op's signature: its name and its
# tensors' dtypes, shapes and strides)
Op = Tuple[str, float, float, str]


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument as a replay needs it (calibrate/ops.py): no data, no device."""
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: torch.dtype

    def __str__(self) -> str:
        contiguous = self.stride == torch.empty(self.shape, device="meta").stride()
        return f"{str(self.dtype).replace('torch.', '')}{list(self.shape)}" + ("" if contiguous else
                                                                                f"s{list(self.stride)}")


def spec_of(x):
    return TensorSpec(tuple(x.shape), tuple(x.stride()), x.dtype) if isinstance(x, torch.Tensor) else x


class OpRecorder(TorchDispatchMode):
    """`with OpRecorder() as rec: ...` records every aten op that launches a kernel: rec.ops counts each
    (class, FLOPs, bytes, signature); rec.specs holds each signature's op and arguments (tensors as TensorSpec)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.specs: Dict[str, tuple] = {}
        self.param_tensors = 0   # the model's (set by the recording: the optimizer steps each)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NO_KERNEL:
            op = classify(func, name, args, kwargs or {}, out)
            if op is not None:
                spec = (func, tree_map(spec_of, args), tree_map(spec_of, kwargs or {}))
                signature = f"{func}({', '.join(map(str, tree_flatten(spec[1:])[0]))})"
                self.ops[(*op, signature)] += 1
                self.specs.setdefault(signature, spec)
        return out


def tensors(tree) -> List[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def nbytes(ts: List[torch.Tensor]) -> float:
    return float(sum(t.numel() * t.element_size() for t in ts))


def classify(func, name: str, args, kwargs, out):
    outs = tensors(out)
    if not outs:
        return None
    moved = nbytes(tensors((args, kwargs))) + nbytes(outs)
    if name in MATMULS:
        a, b = args[1:3] if name in ("addmm", "baddbmm") else args[:2]   # (M, K) x (K, N), batched or grouped
        return ("matmul", 2.0 * a.numel() * b.shape[-1], moved)
    if any(k in name for k in ATTENTION):
        return ("attention", attention_flops(func, args, kwargs), moved)
    return ("memory", 0.0, moved)


def attention_flops(func, args, kwargs) -> float:
    """What SDPA's kernel executes: 4 b h s s' d forward (QK^T and PV), half of it under a causal mask (the kernel
    skips the masked blocks), the backward 2.5x (FlashAttention's convention, in which its rates are published)."""
    named = dict(zip([a.name for a in func._schema.arguments], args))
    named.update(kwargs)
    q, k = named["query"], named["key"]
    b, h, s, d = q.shape
    forward = 4.0 * b * h * s * k.shape[-2] * d * (0.5 if named.get("is_causal") else 1.0)
    return forward * (BACKWARD_OVER_FORWARD if "backward" in func.overloadpacket.__name__ else 1.0)


@dataclass(frozen=True)
class Work:
    """The ops of one forward and backward of `batch` sequences on one rank of a layout, as weighted records:
    Σ weight x (each op's cost) is the work."""
    parts: Tuple[Tuple[float, Tuple[Tuple[Op, int], ...]], ...]
    batch: int = 1
    param_tensors: float = 0.0   # the parameter tensors of the rank's share of the model

    def cost_by_class(self, seconds_of, passes: float, sequences: float, share: float) -> Dict[str, float]:
        """Seconds per op class for `passes` forwards and backwards of `sequences` sequences each at `share` of
        each op (1/tp), in one pass: Σ weight x count x passes x seconds_of(class, FLOPs, bytes, signature), FLOPs
        and bytes scaled from the recorded batch, the signature given where the op runs as recorded (else None)."""
        scale, out = sequences / self.batch * share, {}
        for weight, ops in self.parts:
            for (kind, flops, moved, signature), count in ops:
                seconds = seconds_of(kind, flops * scale, moved * scale, signature if scale == 1 else None)
                out[kind] = out.get(kind, 0.0) + weight * count * passes * seconds
        return out

    def cost(self, seconds_of, passes: float, sequences: float, share: float) -> float:
        return sum(self.cost_by_class(seconds_of, passes, sequences, share).values())


_RECORDED: Dict[str, OpRecorder] = {}


def recorded(cfg, model_cfg, batch: int = 1) -> OpRecorder:
    """The ops of a forward and backward of `batch` sequences of `model_cfg` (fake tensors; the meta device for a
    model they cannot run: SDPA there is its math, an upper figure), once per process for a model, batch, sequence,
    precision and parameter dtype."""
    key = repr((model_cfg, batch, cfg.train.seq_len, cfg.precision.name, cfg.parallel.param_dtype))
    if key not in _RECORDED:
        _RECORDED[key] = on_fake_or_meta(lambda device: _record(cfg, model_cfg, batch, device))[0]
    return _RECORDED[key]


def _record(cfg, model_cfg, batch: int, device: str) -> OpRecorder:
    lm = build(model_cfg, device)
    autocast = computing_as_run(lm, cfg, device)
    x = torch.zeros(batch, cfg.train.seq_len, dtype=torch.long, device=device)
    with OpRecorder() as rec:
        with autocast:
            loss = lm(x, x)
        loss.backward()
    rec.param_tensors = sum(1 for p in lm.parameters() if p.requires_grad)
    return rec


def records_of(cfg, batch: int = 1) -> List[Tuple[float, OpRecorder]]:
    """The records a model's work is made of, with their weights for the whole model: the built-in Llama from a 1-
    and a 2-block record (its blocks are identical: a block is their difference), any other model whole."""
    model = cfg.model
    if isinstance(model, ModelConfig) and model.n_layers > 2:
        blocks = model.n_layers
        return [(2.0 - blocks, recorded(cfg, replace(model, n_layers=1), batch)),
                (blocks - 1.0, recorded(cfg, replace(model, n_layers=2), batch))]
    return [(1.0, recorded(cfg, model, batch))]


def work_of(cfg, pp: int = 1, batch: int = 1) -> Work:
    """A forward and backward of `batch` sequences on a rank of a layout with `pp` stages (its blocks' share; the
    embedding, the head and the loss counted on every stage: the most loaded one's)."""
    records = records_of(cfg, batch)
    if len(records) == 1:
        return Work(((1.0 / pp, tuple(records[0][1].ops.items())),), batch, records[0][1].param_tensors / pp)
    (_, one), (_, two) = records
    blocks = cfg.model.n_layers / pp   # a stage's: one block's ops are the 2-block record's less the 1-block one's
    return Work(((2.0 - blocks, tuple(one.ops.items())), (blocks - 1.0, tuple(two.ops.items()))), batch,
                (2.0 - blocks) * one.param_tensors + (blocks - 1.0) * two.param_tensors)
