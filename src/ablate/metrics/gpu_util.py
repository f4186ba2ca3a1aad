"""GPU utilisation (NVML's, sampled off the loop by a thread) over the measured steps: absent, with the reason, on a
CPU or where NVML cannot be read."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from ablate.metrics.collectors import BuiltIn, Span
from ablate.nvml import UtilSampler


class GpuUtil(BuiltIn):
    def __init__(self, device: torch.device, interval_s: float, notes: Dict[str, str]):
        super().__init__()
        self.notes = notes
        self.nvml = UtilSampler(device.index or 0, interval_s) if device.type == "cuda" else None
        if self.nvml is None or self.nvml.reason:
            notes["gpu_util"] = self.nvml.reason if self.nvml else "no GPU: NVML utilisation does not apply"
        self.samples: List[float] = []

    def start(self) -> None:
        if self.nvml:
            self.nvml.reset()        # utilisation of the measured steps only, not of warm-up or compile

    def interval(self, span: Span) -> Dict[str, Optional[float]]:
        util = self.nvml.take() if self.nvml else None
        if util is not None:
            self.samples.append(util)
        return {"gpu_util": util}

    def summary(self, span: Span) -> Dict[str, Optional[float]]:
        return {"gpu_util": sum(self.samples) / len(self.samples) if self.samples else None}

    def close(self) -> None:
        if self.nvml:
            if self.nvml.reason and not self.samples:
                self.notes["gpu_util"] = self.nvml.reason
            self.nvml.close()
