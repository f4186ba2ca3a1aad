"""The mesh's dims, each declared once, outermost first (torchtitan's ParallelDims): its name, what crosses it (the
collective its traffic is, as nccl-tests names it), how a step hides that traffic, and, for a dim carved from
another's ranks (experts from the data-sharding ranks, as torchtitan carves them), which one. parallel/mesh.py builds
the device mesh from these; the comm counter's groups, the comm model's keys, the network model's bus factors and
exposure, the plan's title, a summary's `mesh`, the console and the report's layout column read them here.
Torch-free: the report reads it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional


@dataclass(frozen=True)
class Dim:
    name: str
    traffic: str                  # all_gather | reduce_scatter | all_reduce | all_to_all | send (nccl-tests' kinds)
    # how a step hides its traffic (predict/network.py): "none" (on the critical path), "backward" (overlaps the
    # backward: DDP's and HSDP's all-reduce), "prefetch" (a unit ahead of the compute: FSDP's gathers)
    hidden_by: str
    meaning: str
    within: Optional[str] = None  # carved from this dim's ranks (not a factor of the world), outer to inner
    named: bool = True            # in a layout's label and words (efsdp follows from dp_shard and ep)


DECLARED = (
    Dim("pp", "send", "none", "pipeline stages: each holds a run of the model's blocks (point to point)"),
    Dim("dp_replicate", "all_reduce", "backward", "data-parallel groups that each hold a whole replica"),
    Dim("dp_shard", "all_gather", "prefetch", "data-parallel ranks that shard parameters, gradients and state"),
    Dim("efsdp", "all_gather", "prefetch", "data-sharding ranks that hold the same experts (dp_shard / ep): FSDP2 "
        "shards the experts over them", within="dp_shard", named=False),
    Dim("ep", "all_to_all", "none", "ranks that split the experts; tokens travel to their experts and back",
        within="dp_shard"),
    Dim("tp", "all_gather", "none", "ranks that split each layer (sequence parallel between the splits)"),
)
BY_NAME: Dict[str, Dim] = {d.name: d for d in DECLARED}
DIMS = tuple(d.name for d in DECLARED)                       # every dim, the mesh's order
FACTORS = tuple(d.name for d in DECLARED if d.within is None)   # the world is their product
CARVED = tuple(d.name for d in DECLARED if d.within is not None)
NAMED_CARVED = tuple(d for d in CARVED if BY_NAME[d].named)
DIMS_NAMED = " x ".join(FACTORS)   # "pp x dp_replicate x dp_shard x tp": what a label's numbers are


def strides(sizes: Dict[str, int]) -> Dict[str, int]:
    """Each dim's stride in the row-major rank order (rank = ((p R + r) S + s) T + t): the world's factors, inner
    ones first; a carved dim within its parent's stride, the inner carved dim at the parent's, the outer one past
    it (dp_shard = efsdp x ep: ep's stride is dp_shard's, efsdp's that x ep)."""
    out, inner = {}, 1
    for dim in reversed(FACTORS):
        out[dim] = inner
        inner *= sizes.get(dim, 1)
    for d in reversed([BY_NAME[c] for c in CARVED]):
        below = [c for c in CARVED if BY_NAME[c].within == d.within and DIMS.index(c) > DIMS.index(d.name)]
        out[d.name] = out[d.within] * math.prod(sizes.get(c, 1) for c in below)
    return {d: out[d] for d in sizes}


def label(mesh: Dict[str, int]) -> str:
    """A mesh record (summary.json's `mesh`) as its sizes in FACTORS' order: "1x2x2x1", a carved dim of more than
    one rank after it ("1x1x4x1 ep2"); a record written before a dim existed has it at 1."""
    carved = "".join(f" {d}{mesh[d]}" for d in NAMED_CARVED if mesh.get(d, 1) > 1)
    return "x".join(str(mesh.get(d, 1)) for d in FACTORS) + carved


def described(mesh: Dict[str, int]) -> str:
    """A mesh record in words: "pp 1 x dp_replicate 2 x dp_shard 2 x tp 1" (a carved dim in use: "(ep 2 within)")."""
    carved = "".join(f" ({d} {mesh[d]} within {BY_NAME[d].within})" for d in NAMED_CARVED if mesh.get(d, 1) > 1)
    return " x ".join(f"{d} {mesh.get(d, 1)}" for d in FACTORS) + carved


def in_use(mesh: Dict[str, int]) -> str:
    """The dims a run splits over, in words: "dp_shard 4", "dp_shard 2 x tp 2", "dp_shard 4 x ep 2"; "one rank"
    when none."""
    used = [f"{d} {mesh[d]}" for d in DIMS if mesh.get(d, 1) > 1 and BY_NAME[d].named]
    return " x ".join(used) or "one rank"
