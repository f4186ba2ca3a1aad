"""conf/optim -> the optimizer over a model's parameters, and the learning rate at each step.

`REGISTRY` decodes `optim.name` (adamw | sgd); a user's optimizer file (`_target_`: any torch.optim.Optimizer class,
or a function returning one) is called with the parameter groups, `lr` and its other keys as written, nothing
inherited (a `_target_` typed on the command line gets `lr` and `optim.args`). Matrices decay, the rest (norms,
biases) do not, whichever optimizer; `describe` records what was built.

The schedule is a pure function of the step (`lr_at`), as transformers' get_cosine_schedule_with_warmup is:
a resumed run is at the same learning rate as the run it continues without any scheduler state to load,
and the same under every strategy (DeepSpeed's engine included).
"""
from __future__ import annotations

import math
import sys
from typing import Callable, Dict, Iterable, List, Optional

import torch

from ablate.config import ConfigError, OptimConfig, UserOptimConfig
from ablate.config.fields import user_object


def is_dtensor(t) -> bool:
    """Whether `t` is a DTensor (split by tensor parallelism, sharded by FSDP2), without importing DTensor's module
    (0.6 s of a run's start, sympy with it): a run that split or sharded nothing never imported it, and then no
    tensor can be one."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def param_groups(params: Iterable[torch.nn.Parameter], weight_decay: Optional[float]) -> List[Dict]:
    """Matrices, then the rest (norms, biases), each split by mesh (`by_mesh`); matrices decay by `weight_decay`, the
    rest not. None: no weight_decay in any group (a user's optimizer without one keeps its own default)."""
    params = [p for p in params if p.requires_grad]
    groups = []
    for decay, chosen in ((weight_decay, [p for p in params if p.dim() >= 2]),
                          (0.0 if weight_decay is not None else None, [p for p in params if p.dim() < 2])):
        decayed = {"weight_decay": decay} if decay is not None else {}
        groups += [{"params": kind, **decayed} for kind in by_mesh(chosen)]
    return groups


def mesh_of(t):
    """The device mesh a DTensor lives on; None for a plain tensor."""
    return t.device_mesh if is_dtensor(t) else None


def by_mesh(params: List[torch.nn.Parameter]) -> List[List[torch.nn.Parameter]]:
    """Parameters grouped by the mesh they live on, in first-seen order: plain tensors, layers split by tensor
    parallelism (the tp mesh), sharded by FSDP2 (dp_shard), or both (dp_shard x tp). A user's tp_plan splits some
    layers only, so one model can hold several kinds; torch's fused and foreach kernels, and DTensor's reductions,
    take one mesh at a time. One list when all share one mesh (the usual case)."""
    groups: Dict[object, List[torch.nn.Parameter]] = {}
    for p in params:
        groups.setdefault(mesh_of(p), []).append(p)
    return list(groups.values()) or [[]]


def adamw(groups: List[Dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW; fused kernel where this torch has one for the device."""
    betas = (cfg.beta1, cfg.beta2)
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, foreach=True)


def sgd(groups: List[Dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=True)


def target(groups: List[Dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    return user_object("optim._target_", cfg._target_)(groups, lr=cfg.lr, **cfg.args)


REGISTRY: Dict[str, Callable[[List[Dict], OptimConfig], torch.optim.Optimizer]] = {"adamw": adamw, "sgd": sgd}


def users(groups: List[Dict], cfg: UserOptimConfig) -> torch.optim.Optimizer:
    """A user's optimizer file: `_target_` with its own arguments as written (weight_decay, if given, is in the
    groups already: matrices only)."""
    make = user_object("optim._target_", cfg.target)
    kwargs = {k: v for k, v in cfg.args.items() if k != "weight_decay"}
    try:
        return make(groups, lr=cfg.lr, **kwargs)
    except TypeError as e:
        raise ConfigError(f"optim={cfg.name}: {cfg.target}(lr={cfg.lr}, **{kwargs}) failed: {e}") from None


def check(cfg) -> None:
    if isinstance(cfg, OptimConfig) and not cfg._target_ and cfg.name not in REGISTRY:
        raise ConfigError(f"optim.name={cfg.name}: not a valid choice; valid choices: {', '.join(REGISTRY)} (or "
                          "a file of your own, DIR/optim/NAME.yaml with `_target_`)")


def build(params: Iterable[torch.nn.Parameter], cfg) -> torch.optim.Optimizer:
    check(cfg)
    if isinstance(cfg, UserOptimConfig):
        return users(param_groups(params, cfg.weight_decay), cfg)
    make = target if cfg._target_ else REGISTRY[cfg.name]
    return make(param_groups(params, cfg.weight_decay), cfg)


def describe(optimizer: torch.optim.Optimizer) -> Dict[str, object]:
    """summary.json's `optimizer`: the class that was built and its hyperparameters as the built optimizer holds
    them (its defaults: lr, betas, eps, weight_decay, alpha, momentum ...), and each group's weight decay."""
    def plain(v):
        return isinstance(v, (bool, int, float, str)) or (isinstance(v, tuple) and all(isinstance(x, (int, float))
                                                                                     for x in v))
    cls = type(optimizer)
    return {"class": f"{cls.__module__}.{cls.__qualname__}",
            "hyperparameters": {k: list(v) if isinstance(v, tuple) else v
                                for k, v in optimizer.defaults.items() if plain(v) and v is not None},
            "group_weight_decay": [g.get("weight_decay") for g in optimizer.param_groups]}


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """The learning rate of optimizer step `step` (1-based): linear warm-up over optim.warmup_steps to
    optim.lr, then constant, or a cosine or linear decay to optim.lr x optim.min_lr_ratio at the last step
    (optim.decay_steps, when given: the floor is held after it)."""
    warmup = cfg.warmup_steps
    if step <= warmup:
        return cfg.lr * step / warmup
    if cfg.schedule == "constant":
        return cfg.lr
    floor = cfg.lr * cfg.min_lr_ratio
    horizon = cfg.decay_steps or total_steps
    progress = min(1.0, (step - warmup) / max(1, horizon - warmup))   # 0 after warm-up .. 1 at the horizon
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "warmup_cosine" else 1 - progress
    return floor + (cfg.lr - floor) * shape


def set_lr(groups: List[Dict], lr: float) -> None:
    for group in groups:
        group["lr"] = lr
