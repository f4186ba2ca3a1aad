"""parallel=fsdp2 | hsdp: torch's fully_shard per transformer block plus the root, over the data-parallel dims of
the run's mesh. fsdp2 shards parameters, gradients and optimizer state across every data-parallel rank (the
mesh's `dp_shard`); hsdp shards within groups of `parallel.shard_size` ranks and replicates across the groups
(`dp_replicate` x `dp_shard`: gradients reduce-scattered within a group, then all-reduced across groups). Each
block's weights are all-gathered before use and its gradients reduce-scattered after backward. With
parallel.tp > 1 the layers are already split over `tp` (tp.py) and FSDP shards those splits (FSDP2 + TP).

Numerics: float32 shards (the master weights), bf16/fp16 compute under autocast, gradients reduced in float32, as
under every torch strategy (precision=bf16 means the same here as under ddp or zero). `parallel.param_dtype=bf16`
adds FSDP2's MixedPrecisionPolicy (torchtitan's default): the shards are all-gathered in bf16 and the blocks
compute on them (half the all-gather bytes and half the unsharded parameters' memory); `parallel.reduce_dtype`
is what gradients are reduce-scattered in (float32 by default). Recorded in the run's numerics."""
from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ablate.config import ConfigError
from ablate.parallel.base import TorchStrategy
from ablate.parallel.ep import experts_of
from ablate.parallel.mesh import EXPERT_SHARD, Layout
from ablate.parallel.state_bytes import Breakdown
from ablate.precision import Precision

DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16}


def mixed_precision(parallel) -> MixedPrecisionPolicy:
    """FSDP2's policy: parameters gathered in parallel.param_dtype (None: as stored), gradients reduced in
    parallel.reduce_dtype."""
    return MixedPrecisionPolicy(param_dtype=DTYPES.get(parallel.param_dtype) if parallel.param_dtype else None,
                                reduce_dtype=DTYPES[parallel.reduce_dtype])


def expert_mesh(mesh, layout: Layout):
    """The mesh a rank's experts are sharded over: the data-sharding ranks that hold the same experts (and the
    replicas, HSDP)."""
    return mesh[EXPERT_SHARD] if layout.dp_replicate == 1 else mesh["dp_replicate", EXPERT_SHARD]


def data_parallel_mesh(mesh, layout: Layout):
    """The mesh FSDP shards over: 1-D (dp_shard) without replicas, 2-D (dp_replicate, dp_shard) with them (HSDP)."""
    return mesh["dp_shard"] if layout.dp_replicate == 1 else mesh["dp_replicate", "dp_shard"]


class FSDP2(TorchStrategy):
    def __init__(self, model, parallel, train, optim_cfg, precision, device, layout: Layout, mesh):
        dp_mesh = data_parallel_mesh(mesh, layout)
        policy = mixed_precision(parallel)
        if layout.ep > 1:   # each rank's experts: sharded over the ranks holding the same ones (parallel/ep.py)
            for experts in experts_of(model):
                fully_shard(experts, mesh=expert_mesh(mesh, layout),
                            reshard_after_forward=parallel.reshard_after_forward, mp_policy=policy)
                # every data-parallel rank's tokens reached these experts through the all-to-all: averaged over all
                experts.set_gradient_divide_factor(layout.dp)
                # gloo has no PREMUL_SUM: sum, then divide; not where the shard group is one rank (FSDP2 divides
                # its gradient there already, and would divide it twice)
                if mesh.device_type == "cpu" and layout.dp_shard > layout.ep:
                    experts.set_force_sum_reduction_for_comms(True)
        for block in model.blocks.modules:   # the model's repeated blocks (model/contract.py), by rule or named
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=parallel.reshard_after_forward, mp_policy=policy)
        for root in getattr(model, "stages", None) or [model]:   # a pipeline's stages are each a root (torchtitan)
            fully_shard(root, mesh=dp_mesh, reshard_after_forward=parallel.reshard_after_forward, mp_policy=policy)
        self.grad_reduce_dtype = DTYPES[parallel.reduce_dtype]
        super().__init__(model, train, optim_cfg, precision, device, layout, mesh)
        self.numerics["param_dtype"] = str(DTYPES[parallel.param_dtype or "float32"]).removeprefix("torch.")

    @classmethod
    def check(cls, parallel, precision: Precision, has_cuda: bool) -> None:
        if precision.spec.loss_scaling:
            raise ConfigError(f"parallel={parallel.name} with precision={precision.cfg.name}: torch's GradScaler "
                              "does not handle sharded gradients here; valid: precision=fp32, bf16")
        if parallel.param_dtype == "bf16" and precision.cfg.name != "bf16":
            raise ConfigError(f"parallel.param_dtype=bf16 with precision={precision.cfg.name}: the blocks would "
                              "compute in bf16 on bf16 weights; give precision=bf16, or parallel.param_dtype=null")

    @classmethod
    def plan_bytes(cls, numels, parallel, precision: Precision, layout: Layout) -> Breakdown:
        n, shard = float(sum(numels)), layout.dp_shard   # fp32 shards within a shard group (hsdp: replicated across)
        return Breakdown(4 * n / shard, 4 * n / shard, 8 * n / shard)

    def micro_step(self, last: bool):
        # skip the reduce-scatter on all but the last micro-step (FSDP2's no_sync equivalent; a pipeline's schedule
        # does it for its micro-batches)
        if self.pipeline is None:
            self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
