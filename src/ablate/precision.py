"""conf/precision -> autocast, the fp16 GradScaler, and fp8 matmuls.

- fp32: nothing.
- bf16: autocast to bfloat16; 8 exponent bits like fp32, so no loss scaling is needed.
- fp16: autocast to float16 + a dynamic GradScaler (loss x scale; the step is skipped and the scale
  halved when a gradient overflows; the scale grows after `growth_interval` clean steps).
- fp8: torchao's float8 training converts nn.Linear layers (E4M3 forward, E5M2 gradients) under bf16
  autocast. Needs CUDA with compute capability >= 8.9 (Ada, Hopper, Blackwell).
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ablate.config import ConfigError, PrecisionConfig

AUTOCAST_DTYPE = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
FP8_MIN_CAPABILITY = (8, 9)


def check_hardware(cfg: PrecisionConfig, device: torch.device) -> None:
    """One-line refusal, before any work starts, of a precision this machine cannot run."""
    if cfg.name != "fp8":
        return
    if device.type != "cuda":
        raise ConfigError("precision=fp8: needs a CUDA GPU with compute capability >= 8.9 (Ada/Hopper); "
                          "this run has no CUDA device. Valid here: fp32, bf16, fp16")
    cap = torch.cuda.get_device_capability(device)
    if cap < FP8_MIN_CAPABILITY:
        raise ConfigError(f"precision=fp8: needs compute capability >= 8.9, this GPU has {cap[0]}.{cap[1]}. "
                          "Valid here: fp32, bf16, fp16")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise ConfigError("precision=fp8: needs torchao (pip install torchao)") from None


class Precision:
    """What the training step asks of the precision group."""

    def __init__(self, cfg: PrecisionConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.dtype: Optional[torch.dtype] = AUTOCAST_DTYPE[cfg.name]
        self.scaler: Optional[torch.amp.GradScaler] = None
        if cfg.name == "fp16":
            self.scaler = torch.amp.GradScaler(
                device.type, init_scale=cfg.init_scale, growth_factor=cfg.growth_factor,
                backoff_factor=cfg.backoff_factor, growth_interval=cfg.growth_interval)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.cfg.name == "fp8":
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            config = Float8LinearConfig.from_recipe_name(self.cfg.fp8_recipe)
            # the LM head stays in bf16: its vocabulary dimension is rarely fp8-friendly
            convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: fqn != "output")
        return model

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale_(self, optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        """Optimizer step; with a scaler, skipped when a gradient is inf/NaN, then the scale updates."""
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()

    def loss_scale(self) -> Optional[float]:
        return self.scaler.get_scale() if self.scaler is not None else None

    def state_dict(self):
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
