"""What the step-time model needs of a machine, from a conf/hardware file (or one `python -m ablate.calibrate`
wrote), and a rank's compute on it (docs/prediction.md, "Compute")."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Optional, Tuple

from ablate.config.dims import label
from ablate.predict.step import Step

CLASSES = ("matmul", "attention", "memory")


@dataclass(frozen=True)
class Machine:
    """Its matmul rate per dtype column (achieved, or a datasheet's peak: `rate_source` says which), the datasheet
    peak per column (MFU's denominator), the bus bandwidth within a node and per device across nodes (bytes/s; None:
    unknown); for the per-op compute model, the achieved attention rate per column, memory bandwidth and least time
    a kernel takes; nccl-tests' bus bandwidth within a node per collective kind and NCCL's latency figures."""
    rate: Dict[str, float]
    peak: Dict[str, float]
    intra_bytes_per_s: Optional[float]
    inter_bytes_per_s: Optional[float]
    rate_source: str
    name: str = ""
    attention: Optional[Dict[str, float]] = None
    memory_bytes_per_s: Optional[float] = None
    launch_s: float = 0.0
    collective: Optional[Dict[str, float]] = None
    latency: Optional[Dict[str, float]] = None
    op_seconds: Optional[Dict[str, float]] = None   # ops timed at their own shapes (a calibrated file's op_us)
    autograd_s: float = 0.0                         # what an op of a training step costs beyond the op itself
    overlap: float = 1.0                            # the share of communication concurrent compute hides
    optimizer_tensor_s: float = 0.0                 # the optimizer's step and clipping per parameter tensor
    strategy_unit: Optional[Dict[str, float]] = None   # a strategy's bookkeeping per unit and pass, by strategy_key
    latency_after: Tuple[Tuple[float, float], ...] = ()   # (seconds of compute before a call, its base latency)
    optimizer_seconds: Optional[Dict[str, float]] = None   # a rank's whole optimizer step, timed at its shapes
    framework_unit: float = 0.0   # what a unit's forward and backward cost beyond its ops (module calls, the loop)

    def intra_of(self, kind: str) -> Optional[float]:
        return (self.collective or {}).get(kind) or self.intra_bytes_per_s

    def attention_rate(self, column: str) -> Optional[float]:
        """SDPA's achieved rate for a column; fp8 runs attention in bf16 (torchao's float8 training converts the
        linears only)."""
        table = self.attention or {}
        return table.get(column) or (table.get("bf16") if column == "fp8" else None)

    def per_op(self, column: str) -> bool:
        """Whether this machine has every figure the per-op model needs in this column."""
        return bool(self.rate.get(column) and self.attention_rate(column) and self.memory_bytes_per_s)


def strategy_key(strategy: str, sizes: Dict[str, int]) -> str:
    """A strategy's bookkeeping figure's key: the strategy and its mesh ("fsdp2 1x1x2x1")."""
    return f"{strategy} {label(sizes)}"


def compute_seconds(step: Step, machine: Machine) -> Tuple[float, Dict[str, float]]:
    """A rank's compute in one step, and its parts: per op class (predict/kernels.py) and the optimizer's step (the
    bytes it reads and writes over the rank's shard, memory-bound), where the machine has the figures and the step
    its ops; else the hardware FLOPs over the matmul rate (a bound where the rate is a datasheet's)."""
    column = step.column
    if step.work is None or not machine.per_op(column):
        return step.hw_flops / machine.rate[column], {}
    rates = {"matmul": machine.rate[column], "attention": machine.attention_rate(column)}
    bandwidth, launch, timed, extra = machine.memory_bytes_per_s, machine.launch_s, machine.op_seconds or {}, \
        machine.autograd_s

    def seconds_of(kind: str, flops: float, moved: float, signature: Optional[str]) -> float:
        if signature in timed:   # this very op, timed on this machine
            return timed[signature] + extra
        return max(flops / rates[kind] if kind in rates else 0.0, moved / bandwidth, launch) + extra

    by_class = step.work.cost_by_class(seconds_of, step.passes, step.micro_sequences, step.share)
    parts = {kind: by_class.get(kind, 0.0) for kind in CLASSES}
    timed_step = (machine.optimizer_seconds or {}).get(step.optimizer_signature)   # this very step, timed here
    parts["optimizer"] = timed_step if timed_step is not None else \
        step.optimizer_bytes / bandwidth + step.param_tensors * machine.optimizer_tensor_s
    units = step.passes * (step.n_blocks / step.sizes.get("pp", 1) + 1)   # (a stage's blocks and the root)
    if machine.framework_unit:   # the Python between the ops: module calls, the loop
        parts["framework"] = machine.framework_unit * units
    unit = (machine.strategy_unit or {}).get(strategy_key(step.strategy, step.sizes))
    if unit is not None:   # FSDP's copies and hooks, DTensor's rules
        parts["strategy"] = unit * units
    return sum(parts.values()), parts


def of_hardware(hw) -> Machine:
    """A conf/hardware file as a Machine: its achieved matmul rate where the file has one (`matmul_tflops`), else
    the datasheet's peak (the prediction is then a bound); NVLink's datasheet figure counts both directions (a
    ring sends one way: half of it), the network's per GPU one way."""
    measured = hw.matmul_flops
    nvlink = hw.nvlink_bytes_per_s / 2 if hw.nvlink_bytes_per_s else None
    per_op = bool(measured and hw.attention_flops and hw.memory_bytes_per_s)
    source = (f"achieved rates per op class from {hw.name}'s figures (matmul, attention, memory, launch; their "
              f"sources in {hw.source})" if per_op else
              "measured matmul rate (the file's matmul_tflops)" if measured else
              "datasheet peak: no measured matmul rate in the file, so a bound (add matmul_tflops)")
    return Machine({**hw.peak_flops, **(measured or {})}, hw.peak_flops, nvlink, hw.network_bytes_per_s, source,
                   hw.name, hw.attention_flops, hw.memory_bytes_per_s, hw.launch_s or 0.0, hw.collective_bytes_per_s,
                   hw.collective_latency_s, hw.op_seconds, hw.autograd_s or 0.0,
                   1.0 if hw.overlap is None else hw.overlap, hw.optimizer_tensor_s or 0.0, hw.strategy_unit_s,
                   tuple(sorted((float(k) * 1e-6, v) for k, v in (hw.collective_latency_after_s or {}).items())),
                   hw.optimizer_seconds, hw.framework_unit_s or 0.0)


def of_run(hw, measured_rate: Optional[float], column: str) -> Machine:
    """The machine a GPU run is on: its hardware file's figures, and its own calibrated GEMM rate (metrics/peak.py's
    probe, the run's dtype) as the matmul rate where there is one."""
    machine = of_hardware(hw)
    if not measured_rate:
        return machine
    return replace(machine, rate={**machine.rate, column: measured_rate},
                   rate_source=machine.rate_source + "; this GPU's calibrated GEMM rate (metrics/peak.py) for its "
                   "matmuls")
