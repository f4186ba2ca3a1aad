"""A step's collectives on a machine's links, as nccl-tests describes them (docs/prediction.md, "Communication"):
per mesh dim, its bytes x the collective's bus factor / the bus bandwidth of the link it crosses, plus a latency per
call; and what of it each strategy leaves exposed."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from ablate.config.dims import BY_NAME
from ablate.predict.machine import Machine
from ablate.predict.step import Step

# nccl-tests' bus-bandwidth factor per collective kind (nccl-tests' PERFORMANCE.md): a dim's traffic is the kind its
# declaration names (config/dims.py: FSDP's gathers and reduce-scatters run at one bus bandwidth in nccl-tests, as
# do the built-in TP plan's, sequence-parallel; a pipeline's are sends; experts' all-to-alls)
BUS_FACTOR = {"all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_reduce": lambda n: 2 * (n - 1) / n, "all_to_all": lambda n: (n - 1) / n, "send": lambda n: 1.0}
# ring steps of one call among n ranks (NCCL's tuning model, src/graph/tuning.cc: nsteps; an all-to-all's n - 1
# peers each sent to once)
STEPS = {"all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1, "all_reduce": lambda n: 2 * (n - 1),
         "all_to_all": lambda n: n - 1, "send": lambda n: 1}


def kind(dim: str) -> str:
    return BY_NAME[dim].traffic
BACKWARD_SHARE = 2 / 3   # of a step's compute: the backward (twice the forward's FLOPs)


def crosses_nodes(step: Step, dim: str) -> bool:
    """A dim's ranks span more than one node: its stride (the product of the dims inside it) x its size."""
    return step.strides[dim] * step.sizes[dim] > step.nproc_per_node


def per_node(step: Step, dim: str) -> int:
    """How many of a dim's group's ranks share one node (row-major ranks: its stride and size against the node's)."""
    stride, size = step.strides[dim], step.sizes[dim]
    return 1 if stride >= step.nproc_per_node else max(1, min(size, step.nproc_per_node // stride))


def link_bytes_per_s(step: Step, dim: str, machine: Machine, kind_of: Optional[str] = None) -> Optional[float]:
    """The bus bandwidth a dim's collectives get: within a node, what nccl-tests measures for its kind there (the
    file's collective_gbytes_per_s; else half the NVLink datasheet figure); across nodes, one NIC per rank of the
    group on each node (NCCL's rings run one per NIC, rail to rail: a group of 8 ranks a node uses 8 NICs, HSDP's
    replicate dim with one rank a node uses one), at most the node's own bandwidth. Source: nccl-tests' multi-node
    all-reduce bus bandwidth on 8 x H100 SXM nodes with NDR InfiniBand (one 400 Gb/s NIC a GPU) is 400-450 GB/s at
    large messages (saturncloud.io/blog/crusoe-nccl-cluster-validation), 8 NICs' 50 GB/s, not one's. An all-to-all
    has no ring to spread over the node's NICs: each rank's own traffic leaves on one, so its bus bandwidth across
    nodes is one NIC's ("Alltoall cannot aggregate the bandwidth of multiple NICs", NCCL's maintainer on 6 nodes of 8
    H100s, NVIDIA/nccl-tests issue 267)."""
    traffic = kind_of or kind(dim)
    intra = machine.intra_of(traffic)
    if not crosses_nodes(step, dim):
        return intra
    if not machine.inter_bytes_per_s:
        return None
    nics = machine.inter_bytes_per_s * (1 if traffic == "all_to_all" else per_node(step, dim))
    return min(nics, intra) if intra else nics


def latency_s(step: Step, dim: str, machine: Machine, between: float = 0.0, kind_of: Optional[str] = None) -> float:
    """One call's latency: NCCL's ring model, a base plus a hop per ring step, the hop over NVLink or the network
    (the file's collective_latency_us: base, hop_nvlink, hop_network; none: 0). Where the file measured the base
    after several amounts of compute (collective_latency_after_us), the base after `between` seconds of it."""
    lat = machine.latency or {}
    hop = lat.get("hop_network" if crosses_nodes(step, dim) else "hop_nvlink", 0.0)
    base = along(machine.latency_after, between) if machine.latency_after else lat.get("base", 0.0)
    return base + STEPS[kind_of or kind(dim)](step.sizes[dim]) * hop


def along(points, x: float) -> float:
    """The line through (x, y) `points` (sorted by x) at x, held at the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return points[-1][1]


# how a step hides each kind of a dim's traffic where its strategy splits it by kind (Step.traffic: ZeRO-1/2, as
# DeepSpeed's stage_1_and_2.py runs them): the gradients' all-reduce in buckets as the backward frees them, the
# updated partitions' all-gather after the optimizer step, with nothing beside it
SPLIT_HIDDEN = {"all_reduce": "backward", "all_gather": "none"}


def parts_of(step: Step, dim: str) -> Dict[str, Tuple[float, float]]:
    """A dim's traffic by collective kind: {kind: (its share of the dim's bytes, its calls)}; the declared kind's
    alone unless the strategy splits it (step.traffic)."""
    return step.traffic.get(dim) or {kind(dim): (1.0, step.calls.get(dim, 0.0))}


def comm_parts(step: Step, machine: Machine, compute: float = 0.0) -> Dict[str, Optional[Dict[str, float]]]:
    """Each dim's seconds of communication in the step by collective kind (None: no bytes or no link for it);
    `compute`: the step's, spread evenly between its calls (the compute before each, for a latency that grows with
    it)."""
    between = compute / max(1.0, sum(step.calls.get(dim, 0.0) for dim in step.comm_bytes))   # the layout's dims
    out: Dict[str, Optional[Dict[str, float]]] = {}
    for dim, nbytes in step.comm_bytes.items():
        parts: Optional[Dict[str, float]] = {}
        for k, (share, calls) in parts_of(step, dim).items():
            link = link_bytes_per_s(step, dim, machine, k)
            if nbytes is None or not link:
                parts = None
                break
            parts[k] = nbytes * share * BUS_FACTOR[k](step.sizes[dim]) / link + \
                calls * latency_s(step, dim, machine, between, k)
        out[dim] = parts
    return out


def exposed(step: Step, dim: str, seconds: float, compute: float, kind_of: Optional[str] = None) -> float:
    """What of a dim's seconds (of one kind of its traffic, where its strategy splits it) the step waits for, as
    its declaration says the step hides it (config/dims.py)."""
    hidden_by = SPLIT_HIDDEN[kind_of] if dim in step.traffic else BY_NAME[dim].hidden_by
    if hidden_by == "prefetch" and step.strategy in ("ddp", "ddp_sync"):   # DDP's buckets: during the backward
        hidden_by = "backward"
    if hidden_by == "none":
        return seconds
    if hidden_by == "backward":   # as the backward runs, but for the last call of each reduction (its last bucket)
        calls = parts_of(step, dim)[kind_of or kind(dim)][1]
        last = seconds * min(1.0, step.reductions / calls) if calls else 0.0
        return min(seconds, max(0.0, seconds - BACKWARD_SHARE * compute) + last)
    unit = seconds / (step.n_blocks + 1)   # the first gather and the last reduce-scatter: one unit's
    return min(seconds, max(0.0, seconds - compute) + unit)
