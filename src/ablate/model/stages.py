"""A network cut into pipeline stages by its blocks (parallel.pp > 1), keeping the model contract whoever's model
it is: the network's forward is a sequence of its blocks (those `model.blocks` names or the rule finds), between
what runs before them (embeddings) and after them (the final norm, the head).

`outline` finds which is which from one forward of two tokens, hooks on the blocks and on every other module that
holds parameters; `cut` gives one stage's network, run by `Stage`:
- on the first stage from the token ids; on the others the hidden state the previous stage sent goes in as the
  input of the stage's first block (the embeddings before the blocks are the first stage's: elsewhere zeros of
  their shape stand in, replaced at once);
- blocks other stages hold are not kept (a pass-through without parameters stands in their place);
- on every stage but the last the forward stops after its last block and returns that block's output (what
  follows - norm, head - is the last stage's alone).
Refused in one line: a model without a list of blocks, a forward that is not such a sequence (a module with
parameters between blocks, a block whose input is not the previous block's output, a block run twice), modules
with parameters before the blocks that are not embeddings, and weights shared across the cut (tied embeddings).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List

import torch
from torch import nn

from ablate.config import AblateConfig, ConfigError
from ablate.model import build
from ablate.model.contract import Blocks, LanguageModel, logits_of, loss_of


@dataclass
class Outline:
    """Where a network's blocks sit in its forward: the modules with parameters before them (embeddings: name ->
    (width, dtype) of their output) and after them."""
    path: str
    before: Dict[str, tuple] = field(default_factory=dict)
    after: List[str] = field(default_factory=list)
    tuples: bool = False   # its blocks return tuples (hidden state first), as some transformers versions' do


def _refuse(model_name: str, why: str) -> ConfigError:
    return ConfigError(f"parallel.pp > 1 with model={model_name}: {why}; a pipeline cuts a model whose forward runs "
                       "its blocks one after another (docs/layouts.md, \"Pipelines\"), or use parallel.pp=1")


def check(cfg: AblateConfig) -> None:
    """A model a pipeline cannot cut, refused before any rank starts (its outline on the meta device)."""
    if cfg.parallel.pp > 1:
        model = build(cfg.model, "meta")
        if model.blocks.modules:   # (counted before the outline's forward, which costs a second or two)
            check_divides(len(model.blocks.modules), cfg.parallel.pp * cfg.parallel.pp_stages_per_rank, cfg.model.name)
        outline(model, cfg.model.name)


def check_divides(n: int, count: int, name: str) -> None:
    """The pipeline's rule (docs/layouts.md, "Pipelines"): the blocks divide into pp x v stages of equal length."""
    if n % count:
        raise ConfigError(f"parallel.pp x pp_stages_per_rank = {count} stages: model={name}'s {n} blocks do not "
                          f"divide into them; valid: pp x v dividing {n}")


def outline(model: LanguageModel, name: str) -> Outline:
    """The network's outline, from one forward of two tokens under no_grad (see above)."""
    blocks = model.blocks
    container = model.net.get_submodule(blocks.path) if blocks.path else None
    if not isinstance(container, nn.ModuleList):
        raise _refuse(name, "it has no list of blocks (model.blocks names one module, or the rule found none)")
    ids = {id(b): i for i, b in enumerate(blocks.modules)}
    inside = {id(m) for b in blocks.modules for m in b.modules()}
    holders = {n: m for n, m in model.net.named_modules()
               if id(m) not in inside and any(True for _ in m.parameters(recurse=False))}
    calls: List[tuple] = []
    hooks = [b.register_forward_hook(lambda m, a, o: calls.append(("block", ids[id(m)], a, o))) for b in blocks.modules]
    hooks += [m.register_forward_hook(lambda m, a, o, n=n: calls.append(("module", n, a, o)))
              for n, m in holders.items()]
    device = next(model.net.parameters()).device
    try:
        with torch.no_grad():
            model.net(torch.zeros(1, 2, dtype=torch.long, device=device))
    finally:
        for h in hooks:
            h.remove()
    return _read(calls, len(blocks.modules), blocks.path, holders, name)


def _read(calls: List[tuple], n: int, path: str, holders: Dict[str, nn.Module], name: str) -> Outline:
    order = [c[1] for c in calls if c[0] == "block"]
    if order != list(range(n)):
        raise _refuse(name, f"its blocks ran in the order {order[:8]}, not each once in turn")
    first = next(i for i, c in enumerate(calls) if c[0] == "block")
    last = max(i for i, c in enumerate(calls) if c[0] == "block")
    between = [c[1] for c in calls[first:last] if c[0] == "module"]
    if between:
        raise _refuse(name, f"`{between[0]}` (with parameters) runs between its blocks")
    previous = None
    for _kind, _, args, out in calls[first:last + 1]:
        if previous is not None and (not args or args[0] is not previous):
            raise _refuse(name, "a block's input is not the previous block's output (a residual added outside the "
                                "blocks, `h = h + block(h)`, is: move it inside the block)")
        previous = out[0] if isinstance(out, (tuple, list)) else out
    result = Outline(path, tuples=isinstance(calls[first][3], (tuple, list)))
    for _kind, module_name, _, out in calls[:first]:
        if not isinstance(holders[module_name], nn.Embedding):
            raise _refuse(name, f"`{module_name}` ({type(holders[module_name]).__name__}, with parameters) runs before "
                                "the blocks and is not an embedding")
        result.before[module_name] = (out.shape[-1], out.dtype)
    result.after = [c[1] for c in calls[last + 1:]]
    shared = {id(p) for n in result.before for p in holders[n].parameters()} & \
        {id(p) for n in result.after for p in holders[n].parameters()}
    if shared:
        raise _refuse(name, "a weight is shared by a module before the blocks and one after (tied embeddings)")
    return result


class _StageOut(Exception):
    """Raised after a stage's last block: its output is the stage's."""

    def __init__(self, hidden):
        super().__init__()
        self.hidden = hidden


class Elsewhere(nn.Module):
    """A block another stage holds: never computes here (the stage's first block takes the received input); it
    returns what the blocks return, a tensor or a tuple."""

    def __init__(self, tuples: bool = False):
        super().__init__()
        self.tuples = tuples

    def forward(self, *args, **kwargs):
        return (args[0],) if self.tuples else args[0]


class Zeros(nn.Module):
    """An embedding the first stage holds: zeros of its output's shape, replaced by what the stage receives."""

    def __init__(self, width: int, dtype: torch.dtype):
        super().__init__()
        self.width, self.dtype = width, dtype

    def forward(self, ids):
        return torch.zeros(*ids.shape, self.width, dtype=self.dtype, device=ids.device)


class NotHere(nn.Module):
    """A module after the blocks (norm, head) on a stage that stops before it: never called."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("ablate: a stage ran a module only the last stage holds")


class Stage(nn.Module):
    """Blocks [lo, hi) of the network, as above: forward(token ids | hidden) -> hidden | logits. `seq_len`: the
    length of the token ids the first stage took (a later stage's input may be cut along the sequence: TP)."""

    def __init__(self, net: nn.Module, path: str, lo: int, hi: int, first: bool, last: bool, seq_len: int):
        super().__init__()
        self.net, self.path, self.lo, self.hi, self.first, self.last = net, path, lo, hi, first, last
        self.seq_len = seq_len

    def forward(self, x):
        blocks, handles = self.net.get_submodule(self.path), []
        tokens = x if self.first else torch.zeros(x.shape[0], self.seq_len, dtype=torch.long, device=x.device)
        if not self.first:
            handles.append(blocks[self.lo].register_forward_pre_hook(lambda module, args: (x, *args[1:]),
                                                                     prepend=True))
        if not self.last:
            handles.append(blocks[self.hi - 1].register_forward_hook(_stop_after))
        try:
            return logits_of(self.net(tokens), tokens)
        except _StageOut as out:
            return out.hidden
        finally:
            for h in handles:
                h.remove()


def _stop_after(module, args, output):
    raise _StageOut(output[0] if isinstance(output, (tuple, list)) else output)


def cut(net: nn.Module, plan: Outline, index: int, count: int, seq_len: int) -> Stage:
    """Stage `index` of `count` equal runs of blocks, from `net` (changed in place: give each stage its copy)."""
    blocks = net.get_submodule(plan.path)
    per = len(blocks) // count
    lo, hi = index * per, (index + 1) * per
    for i in range(len(blocks)):
        if not lo <= i < hi:
            blocks[i] = Elsewhere(plan.tuples)
    if index > 0:
        for name, (width, dtype) in plan.before.items():
            net.set_submodule(name, Zeros(width, dtype))
    if index < count - 1:
        for name in plan.after:
            net.set_submodule(name, NotHere())
    return Stage(net, plan.path, lo, hi, index == 0, index == count - 1, seq_len)


def stages_of(model: LanguageModel, plan: Outline, indices: List[int], count: int, seq_len: int,
              name: str) -> List[Stage]:
    """This rank's stages (`indices` of `count`), each from its own copy of the network but the last."""
    check_divides(len(model.blocks.modules), count, name)
    nets = [copy.deepcopy(model.net) for _ in indices[1:]] + [model.net]
    return [cut(net, plan, i, count, seq_len) for net, i in zip(nets, indices)]


def blocks_of(stages: List[Stage]) -> Blocks:
    """The blocks the stages hold (FSDP2's units, checkpointing's and compile's)."""
    held = [m for s in stages for m in list(s.net.get_submodule(s.path))[s.lo:s.hi]]
    return Blocks(stages[0].path, held, "pipeline stages")


class Pipeline(nn.Module):
    """This rank's stages (`stages`, their stage `indices`), the blocks they hold (FSDP2's units) and the loss the
    last stage takes (the contract's)."""

    def __init__(self, stages: List[Stage], indices: List[int], loss_context=None):
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.indices = indices
        self.loss_fn = loss_of
        self.__dict__["blocks"] = blocks_of(stages)
        if loss_context is not None:   # tensor parallelism's vocab-parallel loss (parallel/tp.py), for the strategy
            self.loss_context = loss_context

    def forward(self, *args, **kwargs):
        raise RuntimeError("ablate: a pipeline runs through its schedule (parallel/pipeline.py), not as one module")


def split(model: LanguageModel, plan: Outline, cfg: AblateConfig, pp_rank: int) -> Pipeline:
    """This rank's stages of the model (looped: stage s on pp rank s % pp, torch's placement for interleaving)."""
    p = cfg.parallel
    count = p.pp * p.pp_stages_per_rank
    indices = list(range(pp_rank, count, p.pp))
    stages = stages_of(model, plan, indices, count, cfg.train.seq_len, cfg.model.name)
    return Pipeline(stages, indices, getattr(model, "loss_context", None))
