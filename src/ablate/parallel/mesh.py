"""The ranks' layout, decoded once: `pp x dp_replicate x dp_shard x tp = world` (torchtitan's ParallelDims).

- `tp`:           ranks that split each layer (tensor parallelism, the innermost dim: one node's fast links);
                  a TP group sees the same micro-batch.
- `dp_shard`:     data-parallel ranks that shard parameters, gradients and optimizer state (fsdp2, zero, and
                  hsdp within a shard group).
- `dp_replicate`: data-parallel groups that each hold a whole replica (ddp; hsdp across shard groups).
- `pp`:           pipeline stages (the outermost dim: the least traffic, point to point): each holds a run of
                  the model's blocks (parallel/pipeline.py); a pipeline's stages see the same batch.

`decode` turns the parallel and launcher nodes into a `Layout` (one-line refusals of what cannot be laid out,
before any rank starts); `build_mesh` makes it torch's DeviceMesh on each rank. Everything downstream (data
sharding, tokens counted, communication by dim, checkpoints, the plan, the record) reads the layout, never the
world size as the data-parallel degree. Ranks are laid out row-major: rank = ((p * R + r) * S + s) * T + t.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ablate.config import AblateConfig, ConfigError, HFModelConfig, ModelConfig, UserModelConfig
from ablate.config.dims import CARVED, DECLARED, DIMS, FACTORS, label
from ablate.config.models import EXPERT_KEYS

# the data-sharding ranks that hold the same experts (dp_shard / ep): FSDP shards the experts over them
EXPERT_SHARD = "efsdp"


@dataclass(frozen=True)
class Layout:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1          # carved from dp_shard (config/dims.py): ranks that split the experts

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different micro-batches one micro-step trains on."""
        return self.dp_replicate * self.dp_shard

    @property
    def model_ranks(self) -> int:
        """Ranks that share one replica's work on the same tokens (its tp splits and pp stages): a device's share
        of the tokens it trains on."""
        return self.tp * self.pp

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        return self.pp, self.dp_replicate, self.dp_shard, self.tp

    def dp_rank(self, rank: int) -> int:
        """Which data-parallel replica's batches this rank reads (the ranks of one TP group and of one pipeline
        read the same)."""
        return rank % (self.dp * self.tp) // self.tp

    def pp_rank(self, rank: int) -> int:
        """This rank's place in its pipeline (stage index, for v = 1)."""
        return rank // (self.dp * self.tp)

    def size(self, dim: str) -> int:
        if dim in CARVED:   # (config/dims.py) ep, and the dp_shard / ep ranks holding the same experts
            return self.ep if dim == "ep" else (self.dp_shard // self.ep if self.ep > 1 else 1)
        return dict(zip(FACTORS, self.shape))[dim]

    def active_dims(self) -> List[str]:
        return [d for d in DIMS if self.size(d) > 1]

    def record(self) -> Dict[str, int]:
        """summary.json's `mesh`: the world's factors, and a carved dim (ep, efsdp) where it splits."""
        return {**dict(zip(FACTORS, self.shape)), **{d: self.size(d) for d in CARVED if self.size(d) > 1}}

    def label(self) -> str:
        """One short name for a report's layout column: e.g. 2x2x1 (dp_replicate x dp_shard x tp)."""
        return label(self.record())



def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_tp(tp: int, world: int, name: str, model) -> None:
    if tp > world:
        raise ConfigError(f"parallel.tp={tp}: larger than the world of {world} rank(s) (launcher.nodes x "
                          f"nproc_per_node); valid choices: {', '.join(map(str, divisors(world)))}")
    if world % tp:
        raise ConfigError(f"parallel.tp={tp}: does not divide the world of {world} rank(s); valid choices: "
                          f"{', '.join(map(str, divisors(world)))}")
    if tp == 1:
        return
    if isinstance(model, ModelConfig):
        heads = min(model.n_heads, model.n_kv_heads)
        if heads % tp:
            raise ConfigError(f"parallel.tp={tp}: does not divide model={model.name}'s attention heads ("
                              f"n_heads={model.n_heads}, n_kv_heads={model.n_kv_heads}); valid choices: "
                              f"{', '.join(str(d) for d in divisors(heads) if world % d == 0)}")
    elif isinstance(model, HFModelConfig):
        raise ConfigError(f"parallel.tp={tp}: model=hf has no tensor-parallel plan here; valid: parallel.tp=1 "
                          "(or a model file of your own with a tp_plan: docs/layouts.md)")
    elif isinstance(model, UserModelConfig) and not model.tp_plan:
        raise ConfigError(f"parallel.tp={tp}: your model ({model.target}) declares no tp_plan (which of its Linear "
                          "layers split column- or row-wise); add `tp_plan:` to its YAML (docs/layouts.md) or use "
                          "parallel.tp=1")


def _check_pp(cfg: AblateConfig, dp_kind: str) -> int:
    """The world one pipeline stage's ranks make (the launcher's world / pp); refusals of a pp that cannot be."""
    p, world = cfg.parallel, cfg.launcher.world_size
    if p.pp == 1:
        return world
    if world % p.pp:
        raise ConfigError(f"parallel.pp={p.pp}: does not divide the world of {world} rank(s) (launcher.nodes x "
                          f"nproc_per_node); valid choices: {', '.join(map(str, divisors(world)))}")
    if dp_kind == "replicate" or p.name.startswith("zero"):
        raise ConfigError(f"parallel={p.name} with parallel.pp={p.pp}: a pipeline's stages are torch modules "
                          "driven by torch.distributed.pipelining's schedules, which run under FSDP2 (or none) but "
                          "not inside DDP's or DeepSpeed's engine; valid with pp > 1: parallel=none, fsdp2, hsdp")
    return world // p.pp


def decode(cfg: AblateConfig, dp_kind: str, tp_refused: Optional[str] = None) -> Layout:
    """The layout of `cfg.parallel` on `cfg.launcher`'s ranks; `dp_kind` is how the strategy spreads data-parallel
    ranks (parallel.Choice.dp: single | replicate | shard | hybrid), `tp_refused` why it takes no tensor
    parallelism, if it does not. ConfigError (one line) when it cannot be."""
    p = cfg.parallel
    world = _check_pp(cfg, dp_kind)
    name = p.name
    if p.tp > 1 and tp_refused:
        raise ConfigError(f"parallel={name} with parallel.tp={p.tp}: {tp_refused}; valid with tp > 1: "
                          "parallel=none, fsdp2, hsdp")
    _check_tp(p.tp, world, name, cfg.model)
    dp = world // p.tp
    if p.shard_size is not None and dp_kind != "hybrid":
        raise ConfigError(f"parallel.shard_size={p.shard_size}: only parallel=hsdp has shard groups; remove it or "
                          "use parallel=hsdp")
    return _with_experts(cfg, _data_parallel(cfg, dp_kind, world, dp))


def _data_parallel(cfg: AblateConfig, dp_kind: str, world: int, dp: int) -> Layout:
    p, name = cfg.parallel, cfg.parallel.name
    if dp_kind == "single":
        if dp > 1:
            raise ConfigError(f"parallel={name} with {world} ranks (launcher nodes x nproc_per_node): one data-"
                              f"parallel rank only (parallel.tp={p.tp}); give parallel.tp={world}, or a data-"
                              "parallel strategy: ddp, ddp_sync, fsdp2, hsdp, zero1, zero2, zero3")
        return Layout(1, 1, p.tp, p.pp)
    if dp_kind == "replicate":
        return Layout(dp, 1, p.tp, p.pp)
    if dp_kind == "shard":
        return Layout(1, dp, p.tp, p.pp)
    return _hybrid(cfg, dp)


def _hybrid(cfg: AblateConfig, dp: int) -> Layout:
    """hsdp: shard groups of parallel.shard_size data-parallel ranks (default one node's), replicated across. On one
    rank it is a world of one, as fsdp2 there (the choice matrix runs every strategy so)."""
    p, launcher = cfg.parallel, cfg.launcher
    shard = p.shard_size if p.shard_size is not None else max(1, min(launcher.nproc_per_node // p.tp, dp))
    if dp % shard:
        raise ConfigError(f"parallel.shard_size={shard}: does not divide the {dp} data-parallel rank(s) "
                          f"({launcher.world_size} ranks / parallel.tp={p.tp}); valid choices: "
                          f"{', '.join(map(str, divisors(dp)))}")
    return Layout(dp // shard, shard, p.tp, p.pp)


def _with_experts(cfg: AblateConfig, layout: Layout) -> Layout:
    """parallel.ep: carved from dp_shard (torchtitan's); one-line refusals of an ep that cannot be."""
    p, model = cfg.parallel, cfg.model
    if p.ep == 1:
        return layout
    experts = model.moe.experts if isinstance(model, ModelConfig) and model.moe else getattr(model, "experts", None)
    if experts is None:
        own = (f"; a model of your own says its experts per mixture as an argument named {' or '.join(EXPERT_KEYS)}"
               if isinstance(model, UserModelConfig) else "")
        raise ConfigError(f"parallel.ep={p.ep}: model={model.name} has no experts (a dense model); valid: "
                          "parallel.ep=1, or a mixture of experts (model=moe_tiny, moe_small, mixtral_8x7b, "
                          f"deepseek_moe_16b){own}")
    if p.name not in ("fsdp2", "hsdp"):
        raise ConfigError(f"parallel={p.name} with parallel.ep={p.ep}: the experts are sharded by FSDP2 over the "
                          "data-sharding ranks they are carved from; valid with ep > 1: parallel=fsdp2, hsdp")
    valid = [d for d in divisors(layout.dp_shard) if experts % d == 0]
    if layout.dp_shard % p.ep or experts % p.ep:
        raise ConfigError(f"parallel.ep={p.ep}: must divide the {layout.dp_shard} data-sharding rank(s) (dp_shard) "
                          f"and {experts_key(model)}={experts}; valid choices: {', '.join(map(str, valid))}")
    return Layout(layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp, p.ep)


def experts_key(model) -> str:
    """Where a model's experts count is given: the built-in's key, a model of one's own's argument, a transformers
    config's field."""
    if isinstance(model, ModelConfig):
        return "model.moe.experts"
    if isinstance(model, UserModelConfig):
        return "model." + next(k for k in EXPERT_KEYS if isinstance(model.args.get(k), int))
    return "model.config's " + "/".join(EXPERT_KEYS)


def build_mesh(layout: Layout, device_type: str):
    """torch's DeviceMesh of the layout (every dim named, size-1 dims kept), on the process group already joined;
    None on a process that joined none (parallel=none on one rank)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        return None
    if layout.ep == 1:
        return init_device_mesh(device_type, layout.shape, mesh_dim_names=FACTORS)
    # experts: dp_shard cut into (dp_shard / ep, ep), ep inner (torchtitan's), then flattened back into dp_shard
    # for the dense parameters: the ranks' order is the dense layout's
    names = ("pp", "dp_replicate", EXPERT_SHARD, "ep", "tp")
    mesh = init_device_mesh(device_type, (layout.pp, layout.dp_replicate, layout.dp_shard // layout.ep, layout.ep,
                                          layout.tp), mesh_dim_names=names)
    mesh[EXPERT_SHARD, "ep"]._flatten("dp_shard")
    return mesh


def group_names(mesh) -> Dict[str, str]:
    """{process group name: mesh dim} for the dims of more than one rank: how a collective's group is told apart.
    A dim spanning the whole world can share the default group's name; then that dim takes it. Dims on the same
    ranks share a group: the outer one takes it (dp_shard over ep: the all-to-alls are told apart by `exchanges`)."""
    if mesh is None:
        return {}
    out: Dict[str, str] = {}
    present = set(mesh.mesh_dim_names)
    for dim in DIMS:
        if (dim in present or dim == "dp_shard") and mesh[dim].size() > 1:
            out.setdefault(mesh[dim].get_group().group_name, dim)
    return out


def exchanges(mesh) -> Dict[str, str]:
    """{process group name: mesh dim} for the dims whose declared traffic is all-to-all (ep): such a call on their
    group counts on them whichever dim the group is also (config/dims.py)."""
    if mesh is None:
        return {}
    present = set(mesh.mesh_dim_names)
    return {mesh[d.name].get_group().group_name: d.name for d in DECLARED
            if d.traffic == "all_to_all" and d.name in present and mesh[d.name].size() > 1}


def world_dim(layout: Layout) -> Optional[str]:
    """The dim whose group is every rank (a collective on the default group moves on it), if one is."""
    return next((d for d in FACTORS if layout.size(d) == layout.world and layout.world > 1), None)
