"""What ablate needs to know of a model before it trains it, measured on the meta device (shapes only, no
memory, no FLOPs spent): its parameters' sizes (ablate.plan, the memory guard), its vocabulary (the data),
its blocks, its FLOPs per token (torch's FLOP counter; the formula for the built-in Llama) and the bytes
its forward keeps for backward at one micro-batch (the activations, ablate.plan's and the memory guard's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.config import AblateConfig, ConfigError, ModelConfig
from ablate.metrics.flops import FlopModel
from ablate.model import build, matmul_params
from ablate.model.contract import ModelContractError, vocab_size_of


@dataclass
class ModelFacts:
    numels: List[int]
    vocab_size: int
    blocks: Dict[str, object]
    activation_bytes: float       # one rank, one micro-step, float32 (an upper figure under bf16 autocast)


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


def saved_bytes(lm, seq: int) -> float:
    """Bytes the forward (loss included) keeps for backward for one sequence: the unique storages autograd
    saves, less the parameters'. What activation memory is, measured for the model as written; a batch keeps
    that many times as much (one sequence: transformers' masks read values a meta tensor does not have when
    a batch holds several)."""
    params = {p.untyped_storage()._cdata for p in lm.parameters()}
    seen: Dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage._cdata not in params:
            seen[storage._cdata] = storage.nbytes()
        return t

    x = tokens_on_meta(1, seq)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lm(x, x)
    return float(sum(seen.values()))


def measure(cfg: AblateConfig) -> ModelFacts:
    """The facts of cfg.model at cfg.train's micro-batch, from meta-device builds of it."""
    lm = build(cfg.model, "meta")
    vocab = vocab_size_of(lm.net)
    if vocab is None:
        raise ModelContractError(f"model={cfg.model.name}: no vocab_size on the model or its config; give the "
                                 "module a `vocab_size` attribute")
    t = cfg.train
    try:
        activations = t.batch_size * saved_bytes(lm, t.seq_len)   # (FLOPs: counted where a run needs them)
    except ModelContractError:
        raise
    except (RuntimeError, NotImplementedError) as e:
        raise ConfigError(f"model={cfg.model.name}: its forward fails on the meta device ({type(e).__name__}: "
                          f"{str(e).splitlines()[0]})") from None
    return ModelFacts([p.numel() for p in lm.parameters()], vocab, lm.blocks.record(), activations)
