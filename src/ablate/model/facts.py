"""What ablate needs to know of a model before it trains it, measured on fake or meta tensors (shapes only, no
memory, no FLOPs spent): its parameters' sizes (ablate.plan, the memory guard), its vocabulary (the data),
its blocks, its FLOPs per token (torch's FLOP counter; the formula for the built-in Llama) and the bytes
its forward keeps for backward at one micro-batch (the activations, ablate.plan's and the memory guard's:
metrics/activations.py counts them, docs/layouts.md gives the model and its sources).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from ablate.config import AblateConfig, ConfigError, ModelConfig
from ablate.metrics.activations import SavedTensors
from ablate.metrics.flops import FlopModel
from ablate.model import build, matmul_params
from ablate.model.contract import ModelContractError, vocab_size_of
from ablate.precision import numerics


@dataclass
class ModelFacts:
    numels: List[int]
    vocab_size: int
    blocks: Dict[str, object]
    activation_bytes: float       # one rank, one micro-step, in the run's precision (metrics/activations.py)
    activation_source: str = ""   # how they were measured


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
    from dataclasses import replace

    return replace(cfg, activation_checkpointing=False)


def flop_model(cfg, seq: int, net) -> FlopModel:
    if isinstance(cfg, ModelConfig):
        return FlopModel.analytic(cfg)
    lengths = sorted({seq, max(1, seq // 2)})
    counts = {n: (counted_flops(cfg, n, False), counted_flops(cfg, n, True)) for n in lengths}
    return FlopModel.fitted(counts, matmul_params(net))


def _plain(cfg):
    """The model without activation checkpointing (the plan accounts for it from the blocks' figures)."""
    return _without_checkpointing(cfg) if cfg.activation_checkpointing else cfg


def saved_on_fake(cfg: AblateConfig) -> Tuple[SavedTensors, List[int], Optional[int], str]:
    """(what one sequence's forward saves for backward, the parameters' sizes, the vocabulary, how it was measured).
    On fake CPU tensors (FakeTensorMode: shapes and dtypes, no memory, no FLOPs): the attention kernel torch picks
    for a real tensor is the one measured (SDPA keeps no score matrix), in the run's precision (autocast). A model
    that cannot run on fake tensors is measured on the meta device (SDPA there keeps the seq^2 scores: an upper
    figure, said in `source`)."""
    compute = numerics(cfg.precision.name).compute_dtype
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return _forward(cfg, "cpu", compute) + ("fake tensors, the run's attention and precision",)
    except ModelContractError:
        raise
    except Exception:   # a model fake tensors cannot run (data-dependent shapes): the meta device, no autocast
        return _forward(cfg, "meta", None) + ("meta device, float32 (this model does not run on fake tensors)",)


def _forward(cfg: AblateConfig, device: str, compute) -> Tuple[SavedTensors, List[int], Optional[int]]:
    lm = build(_plain(cfg.model), device)
    x = torch.zeros(1, cfg.train.seq_len, dtype=torch.long, device=device)
    autocast = torch.autocast("cpu", dtype=compute) if compute is not None and device == "cpu" else nullcontext()
    with autocast, SavedTensors(lm.blocks.modules) as saved:
        lm(x, x)
    return saved, [p.numel() for p in lm.parameters()], vocab_size_of(lm.net)


def activation_bytes(saved: SavedTensors, cfg: AblateConfig, tp: int) -> float:
    """One rank's activations for one micro-batch: the blocks' share split over tp (tensor and sequence
    parallelism split every block's activations: Korthikanti et al. 2022, sec. 4.2.2), the rest (embedding, final
    norm, logits and loss, gathered whole on each rank) not; with activation checkpointing the blocks' inputs
    plus one block's recompute instead of every block's own."""
    blocks = (sum(saved.block_inputs) + max(saved.by_block, default=0)) if cfg.model.activation_checkpointing \
        else sum(saved.by_block)
    outside = saved.bytes - sum(saved.by_block)
    return float(cfg.train.batch_size * (outside + blocks / tp))


def measure(cfg: AblateConfig, tp: Optional[int] = None) -> ModelFacts:
    """The facts of cfg.model at cfg.train's micro-batch: one rank's share at tensor-parallel degree `tp` (default
    the run's, parallel.tp)."""
    try:
        saved, numels, vocab, source = saved_on_fake(cfg)
    except ModelContractError:
        raise
    except (RuntimeError, NotImplementedError) as e:
        raise ConfigError(f"model={cfg.model.name}: its forward fails on the meta device ({type(e).__name__}: "
                          f"{str(e).splitlines()[0]})") from None
    if vocab is None:
        raise ModelContractError(f"model={cfg.model.name}: no vocab_size on the model or its config; give the "
                                 "module a `vocab_size` attribute")
    blocks = build(cfg.model, "meta").blocks.record()
    return ModelFacts(numels, vocab, blocks, activation_bytes(saved, cfg, tp or cfg.parallel.tp), source)
