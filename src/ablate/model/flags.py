"""Which of a model's parameters (in `parameters()` order) a layout keeps a share of: tensor parallelism's splits
(1/tp) and a mixture's stacked experts (1/ep), for the plan's state and peak (model/facts.py, model/peak.py). Each
found on the model itself, built on the meta device once per process for a model and degree."""
from __future__ import annotations

from typing import Dict, List, Optional

from ablate.config import ModelConfig
from ablate.metrics.experts import mixtures_of
from ablate.model import build
from ablate.parallel.tp_plan import split_params

_SPLIT: Dict[str, Optional[List[bool]]] = {}


def split_flags(model_cfg, tp: int, lm=None) -> Optional[List[bool]]:
    """Per parameter (in `numels`' order), whether tensor parallelism at `tp` splits it, from the model's plan
    held against the model (`lm`, the run's own before it is split; else built on the meta device, once per process
    for a model and tp: a plan that names what cannot be split is refused here, in one line, before any rank
    starts). None at tp 1."""
    if tp == 1:
        return None
    if lm is None:
        key = repr((model_cfg, tp))
        if key not in _SPLIT:
            _SPLIT[key] = split_flags(model_cfg, tp, build(model_cfg, "meta"))
        return _SPLIT[key]
    split = split_params(lm.net, model_cfg, tp)
    return [id(p) in split for p in lm.parameters()]


def expert_flags(model_cfg) -> Optional[List[bool]]:
    """Per parameter (in `numels`' order), whether it is a mixture's stacked experts (metrics/experts.py's rule);
    None for a model without a mixture (the built-in Llama's, known from its config without building it)."""
    if isinstance(model_cfg, ModelConfig) and model_cfg.moe is None:
        return None
    key = repr(("experts", model_cfg))
    if key not in _SPLIT:
        lm = build(model_cfg, "meta")
        stacked = {id(p) for m in mixtures_of(lm) for p in m.experts.parameters()}
        _SPLIT[key] = [id(p) in stacked for p in lm.parameters()] if stacked else None
    return _SPLIT[key]
