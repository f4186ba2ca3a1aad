"""A model's tensor-parallel plan held against the model itself (no DTensor needed): which modules each pattern
names, whether they can be split `tp` ways, and which parameters end up split. The run (tp.py), the plan and the
memory guard (model/facts.py) read the same answer, and what cannot be split is refused in one line before any
rank starts.

Patterns match as torch's parallelize_module matches them: one fnmatch per dotted segment (`blocks.*.1`).
"""
from __future__ import annotations

from fnmatch import fnmatch
from typing import Dict, List, Set

from torch import nn

from ablate.config import ConfigError, ModelConfig, UserModelConfig
from ablate.config.tp_plan import STYLES, Split
from ablate.metrics.experts import mixtures_of

SPLITTABLE = (nn.Linear, nn.Embedding)
# where a model file declares its attention heads (nanoGPT, transformers, the built-in Llama's spellings)
HEAD_KEYS = ("n_heads", "n_head", "num_heads", "num_attention_heads", "n_kv_heads", "num_key_value_heads")


def matches(fqn: str, pattern: str) -> bool:
    names, parts = fqn.split("."), pattern.split(".")
    return len(names) == len(parts) and all(fnmatch(n, p) for n, p in zip(names, parts))


def resolve(net: nn.Module, model_cfg: UserModelConfig, tp: int) -> Dict[str, Split]:
    """{module path: its split} for every module the plan names, each checked against `tp`; one line if a pattern
    names nothing, names a module that cannot take its style, or a split does not divide."""
    modules = dict(net.named_modules())
    _check_heads(model_cfg, tp)
    out: Dict[str, Split] = {}
    for pattern, split in model_cfg.splits.items():
        found = [fqn for fqn in modules if fqn and matches(fqn, pattern)]
        if not found:
            raise ConfigError(f"model.tp_plan.{pattern}: names no module of model={model_cfg.name}; its modules: "
                              f"{', '.join(_sample(modules))}")
        for fqn in found:
            _check(pattern, fqn, modules[fqn], split, tp)
            out[fqn] = split
    return out


def _sample(modules: Dict[str, nn.Module], limit: int = 20) -> List[str]:
    """The model's module paths with block indices as `*`, as a pattern would name them."""
    seen: List[str] = []
    for fqn in modules:
        pattern = ".".join("*" if part.isdigit() else part for part in fqn.split("."))
        if fqn and pattern not in seen:
            seen.append(pattern)
    return seen[:limit] + (["..."] if len(seen) > limit else [])


def _check(pattern: str, fqn: str, module: nn.Module, split: Split, tp: int) -> None:
    key = f"model.tp_plan.{pattern}"
    if split.style == "sequence_parallel":
        return
    if not isinstance(module, SPLITTABLE):
        raise ConfigError(f"{key}={split.style}: {fqn} is a {type(module).__name__}; {split.style} splits "
                          "nn.Linear and nn.Embedding only (sequence_parallel runs any module on sequence shards)")
    if isinstance(module, nn.Embedding):
        dim, what = (module.num_embeddings, "rows") if split.style == "rowwise" else (module.embedding_dim, "columns")
    else:
        dim, what = (module.out_features, "output features") if split.style == "colwise" else \
            (module.in_features, "input features")
    parts = tp * split.fused
    if dim % parts:
        fused = f" x fused={split.fused}" if split.fused > 1 else ""
        valid = [str(d) for d in range(1, dim + 1) if dim % (d * split.fused) == 0]
        raise ConfigError(f"{key}: {fqn}'s {dim} {what} do not split over parallel.tp={tp}{fused}; valid "
                          f"parallel.tp: {', '.join(valid)}")


def _check_heads(model_cfg: UserModelConfig, tp: int) -> None:
    """Heads split whole: a plan that splits any projection column-wise needs every head count the model file
    declares to divide by tp (a rank keeps n_heads / tp heads)."""
    if not any(s.style == "colwise" for s in model_cfg.splits.values()):
        return
    for key in HEAD_KEYS:
        heads = model_cfg.args.get(key)
        if isinstance(heads, int) and heads > 0 and heads % tp:
            raise ConfigError(f"parallel.tp={tp}: does not divide model={model_cfg.name}'s {key}={heads} (each tp "
                              f"rank keeps whole heads); valid choices: "
                              f"{', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)}")


def split_params(net: nn.Module, model_cfg, tp: int) -> Set[int]:
    """ids of the parameters that tensor parallelism splits (each rank keeps 1/tp): for the built-in Llama every
    Linear and Embedding weight (its norms run sequence-parallel, whole on each rank: parallel/tp.py); for a
    user's model the weights of the modules its plan splits, and colwise biases (a rowwise bias is whole).
    Empty at tp 1 or for a model without a plan."""
    if tp == 1:
        return set()
    if isinstance(model_cfg, ModelConfig):   # (a mixture stays whole on each tp rank: parallel/tp.py)
        whole = {id(p) for m in mixtures_of(net) for p in m.parameters()}
        return {id(p) for m in net.modules() if isinstance(m, SPLITTABLE) for p in m.parameters(recurse=False)
                if id(p) not in whole}
    if not isinstance(model_cfg, UserModelConfig) or not model_cfg.splits:
        return set()
    out: Set[int] = set()
    for fqn, split in resolve(net, model_cfg, tp).items():
        module = net.get_submodule(fqn)
        if split.style == "colwise":
            out |= {id(p) for p in module.parameters(recurse=False)}
        elif split.style == "rowwise":
            out.add(id(module.weight))
    return out


def one_rank_of(net: nn.Module, model_cfg, tp: int) -> bool:
    """Make `net` (on fake or meta tensors: ablate.plan's forward) keep the shapes one of `tp` ranks keeps under its
    plan, so that what its forward saves for backward is one rank's: each split layer's weight cut to its share,
    and the sequence cut or whole again where a layout says (hooks that slice and repeat, which autograd saves
    nothing for). The real run's collectives are left out: they move bytes, not what is kept. True when changed
    (a user's model with a plan at tp > 1); the built-in Llama keeps its measured formula (model/facts.py)."""
    if tp == 1 or not isinstance(model_cfg, UserModelConfig) or not model_cfg.splits:
        return False
    for fqn, split in resolve(net, model_cfg, tp).items():
        module = net.get_submodule(fqn)
        if split.style == "sequence_parallel":   # takes and gives the rank's sequence shard: as it finds it
            continue
        _cut_weight(module, split.style, tp)
        if default_input(split, module) == "sequence":   # the shard arrives, the whole sequence is gathered
            module.register_forward_pre_hook(lambda m, args: (_repeat(args[0], 1, tp), *args[1:]))
        output = default_output(split)
        if output == "sequence":   # reduce-scattered to the rank's shard of the sequence
            module.register_forward_hook(lambda m, args, out: _cut(out, 1, tp))
        elif output == "replicate" and split.style == "colwise":   # the split features gathered whole
            module.register_forward_hook(lambda m, args, out: _repeat(out, -1, tp))
    return True


def _cut_weight(module: nn.Module, style: str, tp: int) -> None:
    """One rank's share of a split layer's parameters (new tensors of the same kind: fake, meta)."""
    weight = module.weight
    dim = (0 if style == "colwise" else 1) if isinstance(module, nn.Linear) else (1 if style == "colwise" else 0)
    shape = list(weight.shape)
    shape[dim] //= tp
    module.weight = nn.Parameter(weight.new_empty(shape))
    if getattr(module, "bias", None) is not None and style == "colwise":
        module.bias = nn.Parameter(module.bias.new_empty(module.bias.shape[0] // tp))


def _cut(t, dim: int, tp: int):
    return t.narrow(dim, 0, t.shape[dim] // tp)


def _repeat(t, dim: int, tp: int):
    reps = [1] * t.dim()
    reps[dim] = tp
    return t.repeat(*reps)


def default_input(split: Split, module: nn.Module) -> str:
    """The layout a split takes when its entry names none: an Embedding's ids arrive whole."""
    if split.input is not None:
        return split.input
    return "replicate" if isinstance(module, nn.Embedding) else STYLES[split.style][0][0]


def default_output(split: Split) -> str:
    return split.output if split.output is not None else STYLES[split.style][1][0]


__all__ = ["HEAD_KEYS", "default_input", "default_output", "matches", "one_rank_of", "resolve", "split_params"]
