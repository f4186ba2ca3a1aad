"""How fast, before the run: one optimizer step's time on a layout and a machine (docs/prediction.md).

Per optimizer step and rank:
- compute = the hardware FLOPs a device does (the model's, recompute included; its share: 1/(tp x pp) of its
  replica's tokens) / the machine's matmul rate in the run's compute dtype; under a pipeline the step is that over
  1 - the schedule's expected bubble (config/schedules.py);
- communication per mesh dim = the comm model's bytes (parallel/comm_model.py: full buffers, as counted) x the
  collective's bus factor (nccl-tests' convention: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n, a
  pipeline's sends 1) / the bus bandwidth of the link the dim crosses: within a node, or across nodes when its
  ranks span more than one node's (ranks laid out row-major, mesh.py), one NIC per rank of the group on a node;
- what of it is exposed, as each strategy schedules it: FSDP2/HSDP/ZeRO's gathers and reduce-scatters run a block
  ahead, behind the compute, all but the first gather and the last reduce-scatter (one unit's of the blocks + the
  root) when the compute is longer; DDP's and HSDP's all-reduce overlap the backward (2/3 of the compute); tensor
  parallelism's collectives and the pipeline's sends sit on the critical path, all exposed.
step = compute (/ (1 - bubble)) + the exposed communication. Left out: the optimizer's step (memory-bound), data
wait, kernel launch gaps, the interference of communication with compute. Pure arithmetic on the figures given:
the plan (`ablate.plan --hardware`), a GPU run (`for_run`: summary.json's `predicted`) and tests give them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from ablate import hardware
from ablate.config import ModelConfig
from ablate.config.schedules import expected_of
from ablate.model import build_net
from ablate.model.facts import flop_model
from ablate.parallel.comm_model import expected_comm
from ablate.precision import numerics

# nccl-tests' bus-bandwidth factor per mesh dim's collectives (docs: PERFORMANCE.md of nccl-tests)
BUS_FACTOR = {"dp_shard": lambda n: (n - 1) / n, "dp_replicate": lambda n: 2 * (n - 1) / n,
              "tp": lambda n: (n - 1) / n, "pp": lambda n: 1.0}
BACKWARD_SHARE = 2 / 3   # of a step's compute: the backward (twice the forward's FLOPs)


@dataclass(frozen=True)
class Machine:
    """What the prediction needs of a machine: its matmul rate per dtype column (achieved, or a datasheet's peak:
    `rate_source` says which), the datasheet peak per column (MFU's denominator), the bus bandwidth within a node
    and per device across nodes (bytes/s; None: unknown)."""
    rate: Dict[str, float]
    peak: Dict[str, float]
    intra_bytes_per_s: Optional[float]
    inter_bytes_per_s: Optional[float]
    rate_source: str
    name: str = ""


@dataclass
class Step:
    """What one optimizer step asks of each rank: hardware and model FLOPs of a device, bytes per mesh dim (None:
    not modelled), the global tokens, the blocks (FSDP's units), the layout's shape and the compute dtype's column."""
    hw_flops: float
    model_flops: float
    comm_bytes: Dict[str, Optional[float]]
    tokens: float
    n_blocks: int
    sizes: Dict[str, int]             # mesh dim -> ranks (config/dims.py order)
    nproc_per_node: int
    strategy: str                     # parallel.name
    column: str                       # the compute dtype's datasheet column: bf16 | fp32 | fp8
    bubble: float = 0.0               # a pipeline's expected bubble
    strides: Dict[str, int] = field(default_factory=dict)


def crosses_nodes(step: Step, dim: str) -> bool:
    """A dim's ranks span more than one node: its stride (the product of the dims inside it) x its size."""
    return step.strides[dim] * step.sizes[dim] > step.nproc_per_node


def strides(sizes: Dict[str, int]) -> Dict[str, int]:
    out, inner = {}, 1
    for dim in reversed(list(sizes)):
        out[dim] = inner
        inner *= sizes[dim]
    return out


def per_node(step: Step, dim: str) -> int:
    """How many of a dim's group's ranks share one node (row-major ranks: its stride and size against the node's)."""
    stride, size = step.strides[dim], step.sizes[dim]
    return 1 if stride >= step.nproc_per_node else max(1, min(size, step.nproc_per_node // stride))


def link_bytes_per_s(step: Step, dim: str, machine: Machine) -> Optional[float]:
    """The bus bandwidth a dim's collectives get: within a node, the node's; across nodes, one NIC per rank of the
    group on each node (NCCL's rings run one per NIC, rail to rail: a group of 8 ranks a node uses 8 NICs, HSDP's
    replicate dim with one rank a node uses one), at most the node's own bandwidth. Source: nccl-tests' multi-node
    all-reduce bus bandwidth on 8 x H100 SXM nodes with NDR InfiniBand (one 400 Gb/s NIC a GPU) is 400-450 GB/s at
    large messages (saturncloud.io/blog/crusoe-nccl-cluster-validation), 8 NICs' 50 GB/s, not one's."""
    if not crosses_nodes(step, dim):
        return machine.intra_bytes_per_s
    if not machine.inter_bytes_per_s:
        return None
    nics = machine.inter_bytes_per_s * per_node(step, dim)
    return min(nics, machine.intra_bytes_per_s) if machine.intra_bytes_per_s else nics


def comm_seconds(step: Step, machine: Machine) -> Dict[str, Optional[float]]:
    out: Dict[str, Optional[float]] = {}
    for dim, nbytes in step.comm_bytes.items():
        link = link_bytes_per_s(step, dim, machine)
        out[dim] = None if nbytes is None or not link else nbytes * BUS_FACTOR[dim](step.sizes[dim]) / link
    return out


def exposed(step: Step, dim: str, seconds: float, compute: float) -> float:
    if dim in ("tp", "pp"):
        return seconds
    if dim == "dp_replicate" or step.strategy in ("ddp", "ddp_sync"):
        return max(0.0, seconds - BACKWARD_SHARE * compute)
    unit = seconds / (step.n_blocks + 1)   # the first gather and the last reduce-scatter: one unit's
    return min(seconds, max(0.0, seconds - compute) + unit)


def predict(step: Step, machine: Machine) -> Dict[str, object]:
    """summary.json's / the plan's `predicted`: step_time_s, tokens_per_s, mfu, compute_s, exposed_comm_s per dim
    (None where the comm model or the machine has no figure), and the rate's source."""
    step.strides = step.strides or strides(step.sizes)
    rate = machine.rate.get(step.column)
    if not rate:
        return {"step_time_s": None, "why": f"{machine.name}: no matmul rate for {step.column}"}
    compute = step.hw_flops / rate
    busy = compute / (1 - step.bubble)
    comm = comm_seconds(step, machine)
    hidden = {d: (exposed(step, d, s, compute) if s is not None else None) for d, s in comm.items()}
    total = busy + sum(s for s in hidden.values() if s is not None)
    peak = machine.peak.get(step.column)
    return {"step_time_s": total, "tokens_per_s": step.tokens / total,
            "mfu": step.model_flops / total / peak if peak else None, "compute_s": compute,
            "bubble_s": busy - compute, "exposed_comm_s": hidden, "comm_s": comm,
            "rate_source": machine.rate_source}


def of_hardware(hw) -> Machine:
    """A conf/hardware file as a Machine: its measured matmul rate where the file has one (`matmul_tflops`), else
    the datasheet's peak (the prediction is then a bound); NVLink's datasheet figure counts both directions (a
    ring sends one way: half of it), the network's per GPU one way."""
    measured = hw.matmul_flops
    nvlink = hw.nvlink_bytes_per_s / 2 if hw.nvlink_bytes_per_s else None
    return Machine(measured or hw.peak_flops, hw.peak_flops, nvlink, hw.network_bytes_per_s,
                   "measured matmul rate (the file's matmul_tflops)" if measured else
                   "datasheet peak: no measured matmul rate in the file, so a bound (add matmul_tflops)", hw.name)


def of_run(hw, measured_rate: Optional[float], column: str) -> Machine:
    """The machine a GPU run is on: its hardware file's links and datasheet peak, and its own calibrated GEMM rate
    (metrics/peak.py's probe, the run's dtype) as the matmul rate where there is one."""
    machine = of_hardware(hw)
    if not measured_rate:
        return machine
    return Machine({**machine.rate, column: measured_rate}, machine.peak, machine.intra_bytes_per_s,
                   machine.inter_bytes_per_s, "this GPU's calibrated GEMM rate (metrics/peak.py)", hw.name)


def for_run(cfg, layout, facts: Dict[str, object], throughput, notes: Dict[str, str],
            here: Optional[Dict[str, object]] = None) -> Optional[Dict[str, object]]:
    """summary.json's `predicted`: on a CPU, the prediction the run made before its first step (`here`:
    predict/here.py, with its MFU against the run's calibrated peak); on a GPU, this run on its own GPU (its
    hardware file, its calibrated GEMM rate, its FLOP model, the comm model's bytes in `facts["modeled"]`). None
    and the reason in `notes` where there is none."""
    peak = throughput.peak
    comm = {k.split(".", 1)[1]: v for k, v in facts["modeled"].items() if k.startswith("comm_bytes_by_dim.")}
    step = step_of(cfg, layout, throughput.flop_model, comm, facts["blocks"]["count"] or 0)
    if peak.device_name == "cpu":
        if not (here or {}).get("step_time_s"):
            notes["predicted"] = (here or {}).get("why") or "not predicted"
            return None
        mfu = step.model_flops / here["step_time_s"] / peak.measured if peak.measured else None
        return {**here, "mfu": mfu}
    if not cfg.metrics.predict:
        notes["predicted"] = "not predicted: metrics.predict=false"
        return None
    hw = hardware.for_device(peak.device_name)
    if hw is None:
        notes["predicted"] = f"not predicted: no hardware file for {peak.device_name} (conf/hardware)"
        return None
    return predict(step, of_run(hw, peak.measured, step.column))


def for_plan(cfg, layout, n_params: int, n_blocks: int, hw) -> Dict[str, object]:
    """`ablate.plan --hardware`'s `predicted`: the layout on that hardware (its file's rate and links), the FLOPs
    of the model's FLOP model (counted on the meta device for a model not built in)."""
    flops = flops_of(cfg.model, cfg.train.seq_len)
    return predict(step_of(cfg, layout, flops, expected_comm(cfg, layout, n_params), n_blocks), of_hardware(hw))


_FLOPS: Dict[str, object] = {}


def flops_of(model_cfg, seq: int):
    """The model's FLOP model, once per process for a model and a sequence length (the advisor plans many layouts
    of one model): the built-in Llama's formula needs no network; any other model is counted on the meta device."""
    key = repr((model_cfg, seq))
    if key not in _FLOPS:
        net = None if isinstance(model_cfg, ModelConfig) else build_net(model_cfg, "meta")
        _FLOPS[key] = flop_model(model_cfg, seq, net)
    return _FLOPS[key]


def step_of(cfg, layout, flops, comm_bytes: Dict[str, Optional[float]], n_blocks: int) -> Step:
    """One optimizer step of the run `cfg` asks for on `layout`: a device's share of its replica's FLOPs (the FLOP
    model's, recompute included), the comm model's bytes, the pipeline's expected bubble."""
    t = cfg.train
    tokens = replica_tokens(cfg)
    per_replica = flops.training(tokens, tokens * t.seq_len)
    return Step(per_replica.hardware / layout.model_ranks, per_replica.model / layout.model_ranks, comm_bytes,
                global_tokens(cfg, layout), n_blocks, layout.record(), cfg.launcher.nproc_per_node, cfg.parallel.name,
                numerics(cfg.precision.name).peak_column, expected_of(cfg.parallel))


def replica_tokens(cfg) -> int:
    """The tokens one model replica (a data-parallel rank's tp and pp group) trains on per optimizer step."""
    t = cfg.train
    return t.batch_size * t.seq_len * t.grad_accum


def global_tokens(cfg, layout) -> int:
    """The tokens the whole job trains on per optimizer step: every data-parallel replica's."""
    return replica_tokens(cfg) * layout.dp
