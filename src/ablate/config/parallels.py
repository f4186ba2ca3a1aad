"""The `parallel` group's schema (conf/parallel/*.yaml): the layout of the ranks - the strategy, the mesh's tp and
pp dims, hsdp's shard group, FSDP2's mixed precision, a pipeline's schedule, DeepSpeed's knobs - checked when
composed; parallel/mesh.py decodes it once into the device mesh. Kept apart from groups.py as models.py and
optims.py are: the largest group, with a concern (the layout) of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ablate.config.fields import check_ranges, choice, num
from ablate.config.schedules import TORCH_CLASS

# torch.distributed.pipelining's schedules, by the name parallel.pp_schedule gives them (parallel/pipeline.py)
PP_SCHEDULES = tuple(TORCH_CLASS)


@dataclass
class ParallelConfig:
    """The layout of the ranks (docs/layouts.md): the data-parallel strategy (`name`), the tensor-parallel degree
    (`tp`) and, for hsdp, the shard group (`shard_size`); decoded once into a device mesh (parallel/mesh.py).
    DeepSpeed fields apply to zero1/2/3 only."""
    name: str = "none"   # none | ddp | ddp_sync | fsdp2 | hsdp | zero1 | zero2 | zero3
    tp: int = num(1, 1)                  # tensor-parallel degree: ranks that split each layer (the mesh's inner dim)
    pp: int = num(1, 1)                  # pipeline stages' ranks: the model cut into stages by blocks (outer dim)
    ep: int = num(1, 1)                  # expert-parallel degree: ranks of dp_shard that split a mixture's experts
    pp_schedule: str = "1f1b"            # gpipe | 1f1b | interleaved_1f1b | zero_bubble (torch.distributed.pipelining)
    pp_microbatches: Optional[int] = num(None, 1, null="parallel.pp micro-batches")   # the batch cut for the schedule
    pp_stages_per_rank: int = num(1, 1)  # v: stages each pp rank holds (interleaved_1f1b, zero_bubble: v > 1)
    # hsdp: data-parallel ranks in one shard group (sharded within, replicated across); null: one node's
    # ranks, launcher.nproc_per_node / tp
    shard_size: Optional[int] = num(None, 1, null="one node's data-parallel ranks")
    no_sync: bool = True                 # ddp: all-reduce once per optimizer step, not every micro-step
    bucket_cap_mb: Optional[float] = num(None, 0, low_open=True, null="torch's 25 MB")   # ddp: gradient bucket size
    reshard_after_forward: bool = True   # fsdp2
    # fsdp2/hsdp: the dtype parameters are all-gathered and computed in (FSDP2's MixedPrecisionPolicy); null: the
    # master dtype (float32 shards gathered whole); bf16: half the all-gather bytes and unsharded memory
    param_dtype: Optional[str] = None
    reduce_dtype: str = "float32"        # fsdp2/hsdp: the dtype gradients are reduce-scattered in
    # tp > 1: the loss computed vocab-parallel (torch's loss_parallel; each rank keeps 1/tp of the logits); null:
    # true when tp > 1; false gathers the logits whole on every tp rank
    loss_parallel: Optional[bool] = None
    overlap_comm: bool = True            # deepspeed: overlap reduction with backward
    contiguous_gradients: bool = True   # deepspeed: gradients copied into one buffer
    reduce_bucket_size: int = num(50_000_000, 1)   # deepspeed: elements per gradient reduction
    allgather_bucket_size: int = num(50_000_000, 1)   # deepspeed: elements per parameter all-gather
    stage3_prefetch_bucket_size: int = num(50_000_000, 0)   # zero3: elements prefetched ahead of use
    # zero3: parameters smaller than this stay whole on every rank
    stage3_param_persistence_threshold: int = num(100_000, 0)
    offload_optimizer: bool = False   # deepspeed: optimizer state in CPU memory

    def __post_init__(self):
        check_ranges(self, "parallel")
        if self.param_dtype is not None:
            choice("parallel.param_dtype", self.param_dtype, ("bf16", "float32"))
        choice("parallel.reduce_dtype", self.reduce_dtype, ("float32", "bf16"))
        choice("parallel.pp_schedule", self.pp_schedule, PP_SCHEDULES)

    @property
    def microbatches(self) -> int:
        """Micro-batches a pipeline's schedule cuts each batch into (parallel.pp_microbatches, by default pp; 1
        without a pipeline, which refuses pp_microbatches): the forward-backwards a batch takes on a rank."""
        return self.pp_microbatches or self.pp

    @property
    def vocab_parallel(self) -> bool:
        """The loss taken vocab-parallel: parallel.loss_parallel, by default whenever layers are split (tp > 1)."""
        return self.tp > 1 and (self.loss_parallel is None or self.loss_parallel)
