"""conf/model -> the network ablate trains: the built-in Llama (`model=tiny|...|70b`), a transformers model from
its config (`model=hf model.config=PATH`), or a user's own (`DIR/model/NAME.yaml`: `_target_` + arguments).

`REGISTRY` decodes the model node's schema into its builder (nowhere else); `build` wraps the network in
the contract (contract.py: token ids in, logits out, ablate's loss, blocks found by rule) and applies
activation checkpointing to the blocks of a model that does not do it itself.
"""
from __future__ import annotations

import inspect
from typing import Callable, Dict

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ablate.config import ConfigError, HFModelConfig, ModelConfig, UserModelConfig
from ablate.config.fields import user_object
from ablate.config.models import USER_MODEL_KEYS
from ablate.model import checkpointing
from ablate.model.contract import Blocks, LanguageModel, ModelContractError, count_params, find_blocks, matmul_params
from ablate.model.llama import Transformer


def build_llama(cfg: ModelConfig) -> nn.Module:
    return Transformer(cfg)


def build_hf(cfg: HFModelConfig) -> nn.Module:
    """A transformers causal LM from its config, randomly initialised (from_config downloads nothing)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise ConfigError("model=hf needs transformers: pip install 'ablate[hf]'") from None
    try:
        config = AutoConfig.from_pretrained(cfg.config)
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.config={cfg.config}: not a transformers config ({str(e).splitlines()[0]})") from None
    # use_cache as the config has it: without a cache, transformers' masks inspect position values (a host
    # sync per step, and impossible on the meta device where FLOPs and activations are measured)
    return AutoModelForCausalLM.from_config(config)


def target_of(cfg: UserModelConfig) -> Callable:
    """The user's `_target_`, imported (from the user's path: the working directory, PYTHONPATH)."""
    return user_object("model._target_", cfg.target)


def check_no_collision(cfg: UserModelConfig, target: Callable) -> None:
    """A constructor argument named like one of ablate's own model keys would never receive its value: said."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):   # a builtin or C callable: nothing to compare
        return
    taken = [k for k in USER_MODEL_KEYS if k in params and k != "_target_"]
    if taken:
        raise ConfigError(f"model._target_={cfg.target} takes `{taken[0]}`, a key of the model file that ablate reads "
                          f"itself ({', '.join(k for k in USER_MODEL_KEYS if k != '_target_')}): rename that "
                          "argument")


def build_target(cfg: UserModelConfig) -> nn.Module:
    target = target_of(cfg)
    check_no_collision(cfg, target)
    try:
        net = target(**cfg.args)
    except TypeError as e:
        raise ConfigError(f"model={cfg.name}: {cfg.target}(**{dict(cfg.args)}) failed: {e}") from None
    if not isinstance(net, nn.Module):
        raise ModelContractError(f"model._target_={cfg.target} returned {type(net).__name__}, not an nn.Module")
    return net


# the model node's schema -> its builder (config/models.py)
REGISTRY: Dict[type, Callable[..., nn.Module]] = {ModelConfig: build_llama, HFModelConfig: build_hf,
                                                  UserModelConfig: build_target}


class NoInitOnMeta(TorchFunctionMode):
    """A network built on the meta device skips its random initialisation (there are no values to fill): torch's
    first random fill of a meta tensor imports torch._dynamo (~2 s), which a refusal up front must not pay."""

    FILLS = ("normal_", "uniform_", "trunc_normal_", "random_", "bernoulli_", "exponential_")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", "") == "torch.nn.init" or getattr(func, "__name__", "") in self.FILLS:
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def build_net(cfg, device="cpu") -> nn.Module:
    if str(device) == "meta":
        with torch.device(device), NoInitOnMeta():
            return REGISTRY[type(cfg)](cfg)
    with torch.device(device):
        return REGISTRY[type(cfg)](cfg)


def build(cfg, device="cpu") -> LanguageModel:
    """The model of a `model` node, built on `device` ("meta": shapes only, no memory), under the contract; its
    blocks checkpointed as model.activation_checkpointing says (model/checkpointing.py), whoever's model it is."""
    net = build_net(cfg, device)
    blocks = find_blocks(net, getattr(cfg, "blocks", None))
    if cfg.activation_checkpointing:
        if not blocks.modules:
            raise ConfigError(f"model.activation_checkpointing={cfg.activation_checkpointing}: no repeated blocks "
                              f"found in model={cfg.name}; name them with model.blocks=ATTR.PATH")
        checkpointing.apply(blocks.modules, cfg.activation_checkpointing)
    return LanguageModel(net, blocks)


__all__ = ["REGISTRY", "Blocks", "LanguageModel", "ModelContractError", "build", "build_net", "count_params",
           "find_blocks", "matmul_params", "target_of"]
