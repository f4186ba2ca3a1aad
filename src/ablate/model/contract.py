"""The model contract, written down once. Every model ablate trains, ours or the user's, keeps it:

- it maps token ids `[batch, seq]` (int64) to logits `[batch, seq, vocab]`; an output with `.logits` (what a
  transformers model returns) is accepted;
- ablate computes the loss: the shifted cross-entropy (targets are the next tokens, made by the data), in
  float32 whatever the compute precision, plus the model's own auxiliary loss if it has one (`aux_loss_of`: a
  mixture of experts' balance loss);
- `vocab_size` comes from the model (its `vocab_size` attribute, or its `config.vocab_size`, as transformers
  models have it), else from the logits' last dimension;
- its repeated blocks (FSDP2's shard units, activation checkpointing's and compile's unit) are the largest
  nn.ModuleList of one class (`find_blocks`), or the attribute path the model file names (`model.blocks`).

A model that breaks it is refused in one line (ModelContractError) saying what came back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ablate.config import ConfigError


class ModelContractError(ConfigError):
    """The model does not keep the contract above (said in one line, exit 2)."""


@dataclass
class Blocks:
    """The model's repeated blocks and how they were found (summary.json's `blocks`)."""
    path: Optional[str]
    modules: List[nn.Module]
    found_by: str              # "rule" | "named" | "none"

    def record(self) -> Dict[str, object]:
        kinds = sorted({type(m).__name__ for m in self.modules})
        return {"path": self.path, "count": len(self.modules), "class": ",".join(kinds) or None,
                "found_by": self.found_by}


def find_blocks(net: nn.Module, named: Optional[str] = None) -> Blocks:
    """The blocks at `named` (an attribute path), else the largest nn.ModuleList whose members are all of one
    class (ties: the one holding more parameters), else none (the whole model is one unit)."""
    if named:
        try:
            found = net.get_submodule(named)
        except AttributeError:
            raise ConfigError(f"model.blocks={named}: the model has no such submodule") from None
        return Blocks(named, list(found) if isinstance(found, nn.ModuleList) else [found], "named")
    best, best_key = None, (0, 0)
    for path, module in net.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1:
            key = (len(module), sum(p.numel() for p in module.parameters()))
            if key > best_key:
                best, best_key = (path, list(module)), key
    if best is None:
        return Blocks(None, [], "none")
    return Blocks(best[0], best[1], "rule")


def vocab_size_of(net: nn.Module) -> Optional[int]:
    for holder in (net, getattr(net, "config", None), getattr(net, "cfg", None)):
        size = getattr(holder, "vocab_size", None) if holder is not None else None
        if isinstance(size, int) and size > 0:
            return size
    return None


def logits_of(output, tokens: torch.Tensor) -> torch.Tensor:
    """The logits in a model's output, checked against the contract."""
    logits = getattr(output, "logits", output)
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        logits = output[0]
    if not isinstance(logits, torch.Tensor):
        raise ModelContractError(f"the model returned {type(output).__name__}, not logits: it must map token ids "
                                 "[batch, seq] to logits [batch, seq, vocab] (or an output with .logits)")
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(tokens.shape):
        raise ModelContractError(f"the model returned a tensor of shape {list(logits.shape)} for token ids of shape "
                                 f"{list(tokens.shape)}: it must return logits [batch, seq, vocab] = "
                                 f"[{tokens.shape[0]}, {tokens.shape[1]}, vocab]")
    return logits


class LanguageModel(nn.Module):
    """Any contract-keeping network with ablate's loss: forward(tokens, targets) -> the mean cross-entropy.
    Its state dict is the network's under `net.`."""

    def __init__(self, net: nn.Module, blocks: Blocks):
        super().__init__()
        self.net = net
        self.__dict__["blocks"] = blocks   # not registered twice: the blocks are already inside `net`

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None):
        output = self.net(tokens)
        logits = logits_of(output, tokens)
        if targets is None:
            return logits
        loss, extra = loss_of(logits, targets), aux_loss_of(self.net, output)
        return loss if extra is None else loss + extra


def aux_loss_of(net: nn.Module, output) -> Optional[torch.Tensor]:
    """A loss the model adds to ablate's (a mixture of experts' balance loss): the network's `aux_loss()` after its
    forward (the built-in Llama's), or its output's `.aux_loss` (transformers' MoE models when asked for their router
    logits); None for most models."""
    method = getattr(net, "aux_loss", None)
    found = method() if callable(method) else getattr(output, "aux_loss", None)
    return found if isinstance(found, torch.Tensor) else None


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """ablate's loss: the mean cross-entropy of the logits against the next tokens, in float32."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    # logits split by vocabulary (a vocab-parallel loss): the loss comes back replicated on the tp ranks
    return loss.to_local() if hasattr(loss, "to_local") else loss


def count_params(net: nn.Module, non_embedding: bool = True) -> int:
    """Parameters, shared ones once. Non-embedding leaves out what only nn.Embedding modules use (a lookup,
    not a matmul); a tied LM head's matrix is used as a matmul too, so it counts."""
    params = {id(p): p for p in net.parameters()}
    if non_embedding:
        used_by_matmul = {id(p) for m in net.modules() if not isinstance(m, nn.Embedding)
                          for p in m.parameters(recurse=False)}
        embedding_only = {id(p) for m in net.modules() if isinstance(m, nn.Embedding)
                          for p in m.parameters(recurse=False)} - used_by_matmul
        params = {k: p for k, p in params.items() if k not in embedding_only}
    return sum(p.numel() for p in params.values())


def matmul_params(net: nn.Module) -> int:
    """Parameters used as matmul weights (2-D or more, in a module that is not an embedding): N of 6N."""
    seen = {id(p): p for m in net.modules() if not isinstance(m, nn.Embedding)
            for p in m.parameters(recurse=False) if p.dim() >= 2}
    return sum(p.numel() for p in seen.values())
