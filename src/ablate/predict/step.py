"""What one optimizer step asks of each rank of a layout (predict/__init__.py's step_of fills it in)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from ablate.config.dims import strides
from ablate.predict.kernels import Work

__all__ = ["Step", "strides"]


@dataclass
class Step:
    """Hardware and model FLOPs of a device, bytes per mesh dim (None: not modelled), the global tokens, the blocks
    (FSDP's units), the layout's shape and the compute dtype's column; for the per-op compute model, a forward and
    backward's ops (`work`), how many a rank runs and of how many sequences, its share of each op (1/tp), the bytes
    its optimizer step reads and writes; the collective calls per dim (their latency) and the reductions."""
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
    work: Optional[Work] = None
    passes: float = 1.0               # forwards and backwards a step runs: micro-steps x a pipeline's micro-batches
    micro_sequences: float = 0.0      # the sequences of each
    share: float = 1.0
    optimizer_bytes: float = 0.0
    param_tensors: float = 0.0        # the parameter tensors a rank's optimizer steps (a pipeline stage's share)
    optimizer_signature: str = ""     # what a calibrated file's optimizer_us is keyed by (predict.optimizer_signature)
    calls: Dict[str, float] = field(default_factory=dict)
    # the backwards whose gradients a dim hidden by the backward reduces (comm_model.reductions: DDP's and ZeRO's,
    # HSDP's one): the last call of each is issued as its backward ends, with nothing left to hide it
    reductions: float = 1.0
    # a dim whose strategy splits its traffic by collective kind (ZeRO-1/2's dp_shard: the gradients all-reduced,
    # the partitions all-gathered): {dim: {kind: (its share of the dim's bytes, its calls)}}; else the declared kind
    traffic: Dict[str, Dict[str, Tuple[float, float]]] = field(default_factory=dict)
