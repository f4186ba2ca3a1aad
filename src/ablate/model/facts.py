"""What ablate needs to know of a model before it trains it, measured on fake or meta tensors (shapes only, no
memory, no FLOPs spent): its parameters' sizes (ablate.plan, the memory guard), its vocabulary (the data),
its blocks, its FLOPs per token (torch's FLOP counter; the formula for the built-in Llama) and the bytes
its forward keeps for backward at one micro-batch (the activations, ablate.plan's and the memory guard's:
metrics/activations.py counts them, docs/layouts.md gives the model and its sources).
"""
from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ablate.config import AblateConfig, ModelConfig
from ablate.metrics.activations import SavedTensors
from ablate.metrics.experts import mixtures_of
from ablate.metrics.flops import COUNTED_REAL, FlopModel
from ablate.model import build, checkpointing, matmul_params
from ablate.model.contract import ModelContractError, vocab_size_of
from ablate.model.flags import expert_flags, split_flags
from ablate.parallel.tp_plan import one_rank_of
from ablate.precision import numerics


@dataclass
class ModelFacts:
    numels: List[int]
    vocab_size: int
    blocks: Dict[str, object]
    activation_bytes: Optional[float]   # one rank, one micro-step, in the run's precision (metrics/activations.py)
    activation_source: str = ""   # how they were measured
    # which of `numels` tensor parallelism splits at the run's tp (parallel/tp_plan.py); None: every one (tp 1)
    split: Optional[List[bool]] = None
    # for the planned peak (model/peak.py): what one sequence's forward saved, per block (None: not measured), and
    # the block each of `numels` belongs to (None: outside the blocks, e.g. the embedding and the head)
    saved: Optional[SavedTensors] = None
    param_block: Optional[List[Optional[int]]] = None
    # which of `numels` are a mixture's stacked experts (expert parallelism keeps 1/ep of them); None: no mixture
    experts: Optional[List[bool]] = None


def tokens_on_meta(batch: int, seq: int) -> torch.Tensor:
    return torch.zeros(batch, seq, dtype=torch.long, device="meta")


def counted_flops(cfg, seq: int, checkpointed: bool) -> float:
    """Training FLOPs (forward + backward) of one sequence of `seq` tokens, counted on the meta device."""
    model_cfg = cfg if checkpointed or not cfg.activation_checkpointing else _without_checkpointing(cfg)
    lm = build(model_cfg, "meta")
    x = tokens_on_meta(1, seq)
    with FlopCounterMode(display=False) as counter:
        lm(x, x).backward()
    return float(counter.get_total_flops())


def _without_checkpointing(cfg):
    return replace(cfg, activation_checkpointing=False)


def real_flops(lm, seq: int, compute_dtype) -> float:
    """Training FLOPs of one sequence counted on the real model, in the run's dtype (autocast): for a model the meta
    device cannot run (a mixture of experts' grouped matmul wants bf16 there). Its gradients are dropped and the
    random state put back: training starts as it would have."""
    device = next(lm.parameters()).device
    x = torch.zeros(1, seq, dtype=torch.long, device=device)
    autocast = torch.autocast(device.type, dtype=compute_dtype) if compute_dtype is not None else nullcontext()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        # SDPA's math backend for this pass: its matmuls are counted, where the CPU's fused kernel is invisible to
        # the counter (attention's FLOPs were missing: -10.5% on a small Mixtral)
        with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
            with autocast:
                loss = lm(x, x)
            loss.backward()
    for p in lm.parameters():
        p.grad = None
    return float(counter.get_total_flops())


def flop_model(cfg, seq: int, net, lm=None, compute_dtype=None) -> FlopModel:
    """The built-in Llama's formula; any other model counted on the meta device, or, where the meta device cannot
    run it and the real model `lm` is given, on one real sequence (summary.json's `flops_source` says which)."""
    if isinstance(cfg, ModelConfig):
        return FlopModel.analytic(cfg)
    lengths = sorted({seq, max(1, seq // 2)})
    try:
        plain = {n: counted_flops(cfg, n, False) for n in lengths}
        # without activation checkpointing nothing is recomputed: the same count, not counted again (each count is a
        # forward and backward on the meta device: ~0.9 s for an 8B model at 2048 tokens)
        full = {n: counted_flops(cfg, n, True) for n in lengths} if cfg.activation_checkpointing else plain
        counts = {n: (plain[n], full[n]) for n in lengths}
        return FlopModel.fitted(counts, matmul_params(net))
    except (RuntimeError, NotImplementedError) as e:   # a probe never decides whether a model that runs may train
        if lm is None:
            raise
        counts = {n: (real_flops(lm, n, compute_dtype),) * 2 for n in lengths}
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}"[:160]
        return FlopModel.fitted(counts, matmul_params(net), source=f"{COUNTED_REAL} ({why})")


def _plain(cfg):
    """The model without activation checkpointing (the plan accounts for it from the blocks' figures)."""
    return _without_checkpointing(cfg) if cfg.activation_checkpointing else cfg


T = TypeVar("T")
Saved = Tuple[SavedTensors, List[int], Optional[int], Dict[str, object], List[Optional[int]], str]


REPEATED_FROM = 3   # the built-in Llama's activations are measured on this many blocks, then repeated (identical)
_SAVED: Dict[str, Saved] = {}
_SHAPES: Dict[str, Tuple[List[int], Dict[str, object], List[Optional[int]]]] = {}


def saved_on_fake(cfg: AblateConfig, tp: int = 1) -> Saved:
    """(what one sequence's forward saves for backward, the parameters' sizes, the vocabulary, the blocks, each
    parameter's block, how it was measured), once per process for a model, sequence, precision and split (the
    advisor's layouts differ in their batch, which one sequence's figures are multiplied by).
    On fake CPU tensors (FakeTensorMode: shapes and dtypes, no memory, no FLOPs): the attention kernel torch picks
    for a real tensor is the one measured (SDPA keeps no score matrix), in the run's precision (autocast). A model
    that cannot run on fake tensors is measured on the meta device (SDPA there keeps the seq^2 scores: an upper
    figure, said in `source`). `tp`: a user's model is measured as one of tp ranks under its plan
    (parallel/tp_plan.py one_rank_of); the built-in Llama whole (activation_bytes divides its blocks). The built-in
    Llama's forward runs on three blocks, its middle block's figures repeated for the rest (its blocks are
    identical: through the 80 blocks of a 70B model on fake tensors took 6 s, through 3 under 0.3 s;
    tests/test_peak.py holds the two equal), its parameters from the whole model built on the meta device."""
    key = repr((cfg.model, cfg.train.seq_len, cfg.precision.name, tp, cfg.parallel.vocab_parallel,
                cfg.parallel.param_dtype))
    if key in _SAVED:
        return _SAVED[key]
    model = cfg.model
    if isinstance(model, ModelConfig) and model.n_layers > REPEATED_FROM:
        saved, _, vocab, _, _, source = saved_on_fake(replace(cfg, model=replace(model, n_layers=REPEATED_FROM)), tp)
        _SAVED[key] = (saved.repeated(model.n_layers), *shapes(_plain(model))[:1], vocab,
                       *shapes(_plain(model))[1:], source)
        return _SAVED[key]
    result, on_fake = on_fake_or_meta(lambda device: _forward(cfg, device, tp))
    _SAVED[key] = result + ("fake tensors, the run's attention and precision" if on_fake else
                            "meta device, float32 (this model does not run on fake tensors)",)
    return _SAVED[key]


def shapes(model_cfg) -> Tuple[List[int], Dict[str, object], List[Optional[int]]]:
    """(its parameters' sizes, its blocks, each parameter's block) of a model built on the meta device, once per
    process for a model."""
    key = repr(model_cfg)
    if key not in _SHAPES:
        lm = build(model_cfg, "meta")
        block_of = {id(p): i for i, block in enumerate(lm.blocks.modules) for p in block.parameters()}
        _SHAPES[key] = ([p.numel() for p in lm.parameters()], lm.blocks.record(),
                        [block_of.get(id(p)) for p in lm.parameters()])
    return _SHAPES[key]


def on_fake_or_meta(measure: Callable[[str], T]) -> Tuple[T, bool]:
    """(measure("cpu") on fake CPU tensors, True), or for a model fake tensors cannot run (data-dependent shapes)
    (measure("meta"), False): a model's forward measured without memory or FLOPs (here and predict/kernels.py). A
    ModelContractError is the model's own, raised."""
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")   # logs each kernel that fails, traceback and all:
    level, fake_log.level = fake_log.level, logging.CRITICAL        # a model it cannot run is said once, by the caller
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return measure("cpu"), True
    except ModelContractError:
        raise
    except Exception:   # the meta device, no autocast
        return measure("meta"), False
    finally:
        fake_log.setLevel(level)


def computing_as_run(lm, cfg: AblateConfig, device: str):
    """`lm` set to compute as the run does: FSDP2's mixed precision puts the blocks on bf16 parameters (their data
    swapped: Module.to cannot swap fake tensors); the returned context is the run's autocast (fake CPU tensors only)."""
    if cfg.parallel.param_dtype == "bf16":
        for p in lm.parameters():
            p.data = p.data.to(torch.bfloat16)
    compute = numerics(cfg.precision.name).compute_dtype
    return torch.autocast("cpu", dtype=compute) if compute is not None and device == "cpu" else nullcontext()


def _forward(cfg: AblateConfig, device: str, tp: int) -> Tuple:
    lm = build(_plain(cfg.model), device)
    numels = [p.numel() for p in lm.parameters()]   # the whole model's: the state plan splits them itself
    autocast = computing_as_run(lm, cfg, device)
    block_of = {id(p): i for i, block in enumerate(lm.blocks.modules) for p in block.parameters()}
    param_block = [block_of.get(id(p)) for p in lm.parameters()]
    one_rank_of(lm.net, cfg.model, tp)
    x = torch.zeros(1, cfg.train.seq_len, dtype=torch.long, device=device)
    vocab = vocab_size_of(lm.net)
    with autocast, SavedTensors(lm.blocks.modules, vocab, list(mixtures_of(lm.net))) as saved, \
            checkpointing.KeptBySelective(lm.blocks.modules) as kept:
        lm(x, x)
    saved.kept_by_block = kept.by_block
    return saved, numels, vocab, lm.blocks.record(), param_block


def activation_bytes(saved: SavedTensors, cfg: AblateConfig, tp: int) -> float:
    """One rank's activations for one micro-batch: for the built-in Llama the blocks' share split over tp (tensor
    and sequence parallelism split every block's activations: Korthikanti et al. 2022, sec. 4.2.2), the rest
    (embedding, final norm; the logits and the loss's tensors split by vocabulary under a vocab-parallel loss, else
    gathered whole on each rank) not; a user's model was measured as one
    rank already (saved_on_fake's tp). With activation checkpointing, what the blocks keep at their backward peak
    (kept_by_blocks)."""
    tp = tp if isinstance(cfg.model, ModelConfig) else 1
    blocks = kept_by_blocks(saved, cfg.model.activation_checkpointing, tp)
    outside = saved.bytes - sum(saved.by_block)
    if tp > 1 and cfg.parallel.vocab_parallel:   # the logits and the loss's tensors: each rank keeps 1/tp of them
        outside -= saved.vocab_bytes * (1 - 1 / tp)
    return float(cfg.train.batch_size * (outside + blocks))


def on_tp_rank(saved: SavedTensors, tp: int) -> List[float]:
    """What each block saves on one of tp ranks (one sequence): split over tp, but what a module each rank runs
    whole saves (a mixture of experts: its input gathered, as torchtitan's ETP 1)."""
    whole = saved.whole_by_block or [0] * len(saved.by_block)
    return [(x - w) / tp + w for x, w in zip(saved.by_block, whole)]


def kept_by_blocks(saved: SavedTensors, mode, tp: int = 1) -> float:
    """The blocks' activations at their peak under model.activation_checkpointing (model/checkpointing.py). Each
    block keeps, from forward to its backward: everything it saves (not checkpointed), its input (checkpointed), or
    its input and the outputs selective checkpointing saves (saved.kept_by_block, measured per op). Backward runs
    the blocks last to first, recomputing a checkpointed block while the blocks before it still hold theirs: the
    peak is the larger of what all keep at the end of forward and, for each checkpointed block, what the blocks
    before it keep plus its own and its recompute (everything it saves). On one of `tp` ranks (on_tp_rank)."""
    full = on_tp_rank(saved, tp)
    if not mode:
        return float(sum(full))
    kept = kept_per_block(saved, mode, tp)
    recompute = [sum(kept[:i]) + kept[i] + full[i] for i in range(len(full)) if checkpointing.checkpointed(i, mode)]
    return float(max([sum(kept), *recompute]))


def kept_per_block(saved: SavedTensors, mode, tp: int = 1) -> List[float]:
    """What each block keeps from forward to its backward (one sequence, on one of `tp` ranks): everything it
    saves, or, checkpointed, its input and what selective checkpointing saves (both split over tp)."""
    extra = saved.kept_by_block if mode == "selective" else [0] * len(saved.by_block)
    full = on_tp_rank(saved, tp)
    return [(saved.block_inputs[i] + extra[i]) / tp if checkpointing.checkpointed(i, mode) else full[i]
            for i in range(len(saved.by_block))]


_MEASURED: Dict[str, ModelFacts] = {}


def measure(cfg: AblateConfig, tp: Optional[int] = None) -> ModelFacts:
    """measure_facts, once per process for a configuration (the launcher's checks and the run's plan ask alike)."""
    key = repr((cfg.model, cfg.train.seq_len, cfg.train.batch_size, cfg.precision.name, tp or cfg.parallel.tp,
                cfg.parallel.vocab_parallel, cfg.parallel.param_dtype))
    if key not in _MEASURED:
        _MEASURED[key] = measure_facts(cfg, tp)
    return _MEASURED[key]


def measure_facts(cfg: AblateConfig, tp: Optional[int] = None) -> ModelFacts:
    """The facts of cfg.model at cfg.train's micro-batch: one rank's share at tensor-parallel degree `tp` (default
    the run's, parallel.tp). A model whose forward runs on neither fake nor meta tensors (a mixture of experts'
    grouped matmul) is not refused for it: its activations are not measured (None, `activation_source` says why)."""
    try:
        tp = tp or cfg.parallel.tp
        saved, numels, vocab, blocks, param_block, source = saved_on_fake(cfg, tp)
        activations = activation_bytes(saved, cfg, tp)
    except ModelContractError:
        raise
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        lm = build(cfg.model, "meta")
        numels, vocab, activations = [p.numel() for p in lm.parameters()], vocab_size_of(lm.net), None
        saved = param_block = None
        blocks = lm.blocks.record()
        source = (f"not measured: its forward runs on neither fake nor meta tensors ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:160]})")
    vocab = vocab or declared_vocab(cfg.model)
    if vocab is None:
        raise ModelContractError(f"model={cfg.model.name}: no vocab_size on the model, its config or its YAML; give "
                                 "the module a `vocab_size` attribute or the model file a `vocab_size:` key")
    if activations is not None and cfg.model.activation_checkpointing:   # measured without it: the blocks as the
        blocks = shapes(cfg.model)[1]                                    # run wraps them
    return ModelFacts(numels, vocab, blocks, activations, source, split_flags(cfg.model, tp or cfg.parallel.tp),
                      saved, param_block, expert_flags(cfg.model))


def declared_vocab(model_cfg) -> Optional[int]:
    """A user's model file's `vocab_size:` (a constructor argument), for a module without the attribute."""
    size = getattr(model_cfg, "args", {}).get("vocab_size")
    return int(size) if isinstance(size, int) and size > 0 else None
