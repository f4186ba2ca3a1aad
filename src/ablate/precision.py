"""conf/precision -> what each precision choice means, declared once (`REGISTRY`).

One meaning per knob, under every strategy where the engine allows it (README, "Numerics"):
- fp32: everything in float32.
- bf16: matmuls in bfloat16 under autocast, parameters and optimizer state in float32 (the parameters
  are the master weights), gradients float32 and reduced in float32. 8 exponent bits: no loss scaling.
- fp16: as bf16 with float16, plus dynamic loss scaling (loss x scale; a step whose gradients overflow
  is skipped and the scale halved; it grows after `growth_interval` clean steps).
- fp8: torchao's float8 training converts nn.Linear layers (E4M3 forward, E5M2 gradients) under bf16
  autocast. Needs CUDA with compute capability >= 8.9 (Ada, Hopper, Blackwell).

Strategies (parallel/) turn this declaration into action and report what they really did; nothing else
decodes a precision name.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from ablate.config import ConfigError, PrecisionConfig
from ablate.nvml import handle

FP8_MIN_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class Numerics:
    """The declared meaning of one precision choice."""
    compute_dtype: Optional[torch.dtype]   # autocast dtype; None: no autocast (float32)
    loss_scaling: bool                     # dynamic loss scaling is part of the recipe
    fp8_matmuls: bool                      # nn.Linear layers converted to float8 training
    peak_column: str                       # datasheet column of metrics/flops.py's table
    probe_dtype: torch.dtype               # dtype of the GEMM probe that measures this machine's peak

    @property
    def compute_name(self) -> str:
        name = _dtype_name(self.compute_dtype or torch.float32)
        return f"float8 matmuls (E4M3 fwd, E5M2 grad), {name} elsewhere" if self.fp8_matmuls else name


REGISTRY: Dict[str, Numerics] = {
    "fp32": Numerics(None, False, False, "fp32", torch.float32),
    "bf16": Numerics(torch.bfloat16, False, False, "bf16", torch.bfloat16),
    "fp16": Numerics(torch.float16, True, False, "bf16", torch.float16),     # fp16 tensor-core peak == bf16
    # the probe runs in bf16: a datasheet fp8 row is needed for a true fp8 peak (see metrics/flops.py)
    "fp8": Numerics(torch.bfloat16, False, True, "fp8", torch.bfloat16),
}


def numerics(name: str) -> Numerics:
    return REGISTRY[name]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_hardware(cfg: PrecisionConfig, device: torch.device) -> None:
    """One-line refusal, before any work starts, of a precision this machine cannot run."""
    if not numerics(cfg.name).fp8_matmuls:
        return
    valid = ", ".join(k for k, v in REGISTRY.items() if not v.fp8_matmuls)
    if device.type != "cuda":
        raise ConfigError("precision=fp8: needs a CUDA GPU with compute capability >= 8.9 (Ada/Hopper); "
                          f"this run has no CUDA device. Valid here: {valid}")
    cap = compute_capability(device.index or 0)
    if cap < FP8_MIN_CAPABILITY:
        raise ConfigError(f"precision=fp8: needs compute capability >= 8.9, this GPU has {cap[0]}.{cap[1]}. "
                          f"Valid here: {valid}")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise ConfigError("precision=fp8: needs torchao (pip install torchao)") from None


def compute_capability(index: int):
    """(major, minor) from NVML, which does not start CUDA: a preflight that started it would fix the
    allocator settings before the allocator group is applied. torch's answer when NVML is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle(pynvml, index)))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return torch.cuda.get_device_capability(index)


class Precision:
    """The torch side of a precision choice: autocast, fp8 conversion and a torch GradScaler.
    Owned by a strategy (parallel/), which decides whether its engine uses them."""

    def __init__(self, cfg: PrecisionConfig, device: Optional[torch.device] = None):
        """`device`: where it computes (None while a strategy only checks or plans)."""
        self.cfg, self.device, self.spec = cfg, device, numerics(cfg.name)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.spec.fp8_matmuls:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            config = Float8LinearConfig.from_recipe_name(self.cfg.fp8_recipe)
            # the LM head stays in bf16: its vocabulary dimension is rarely fp8-friendly
            convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn != "output")
        return model

    def autocast(self):
        if self.spec.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.spec.compute_dtype)

    def grad_scaler(self) -> Optional[torch.amp.GradScaler]:
        """torch's dynamic loss scaler, when the recipe has loss scaling."""
        if not self.spec.loss_scaling:
            return None
        c = self.cfg
        return torch.amp.GradScaler(self.device.type, init_scale=c.init_scale, growth_factor=c.growth_factor,
                                    backoff_factor=c.backoff_factor, growth_interval=c.growth_interval)

    def record(self, param_dtype: torch.dtype, master_dtype: torch.dtype, grad_reduce_dtype: Optional[torch.dtype],
               loss_scaling: str, note: str = "") -> Dict[str, object]:
        """summary.json's `numerics`: what this run stored, computed and reduced in."""
        out = {"precision": self.cfg.name, "compute_dtype": self.spec.compute_name,
               "param_dtype": _dtype_name(param_dtype), "master_dtype": _dtype_name(master_dtype),
               "grad_reduce_dtype": _dtype_name(grad_reduce_dtype) if grad_reduce_dtype else None,
               "loss_scaling": loss_scaling}
        if note:
            out["note"] = note
        return out
