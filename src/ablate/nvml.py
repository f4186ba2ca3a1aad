"""GPU utilisation as nvidia-smi reports it, sampled by NVML in a background thread.

"Utilisation" is the share of time a kernel was running, not how much of the GPU it used: a GPU
waiting on a tiny kernel or a spinning NCCL kernel reads 100%. Logging it beside MFU shows that gap.
NVML numbers GPUs physically and ignores CUDA_VISIBLE_DEVICES, which torch applies: the device is looked
up by what CUDA_VISIBLE_DEVICES says (an index or a UUID). An NVML error stops the sampler with a reason.
"""
from __future__ import annotations

import os
import threading
from typing import List, Optional, Union


def nvml_device(torch_index: int, visible: Optional[str] = None) -> Union[int, str]:
    """The NVML index (int) or UUID (str) of torch's device `torch_index` under CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if not visible:
        return torch_index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    entry = entries[torch_index]
    return int(entry) if entry.isdigit() else entry


def handle(pynvml, torch_index: int):
    """The NVML handle of torch's device `torch_index` (by index or UUID, as CUDA_VISIBLE_DEVICES names it)."""
    device = nvml_device(torch_index)
    return (pynvml.nvmlDeviceGetHandleByIndex(device) if isinstance(device, int)
            else pynvml.nvmlDeviceGetHandleByUUID(device))


class UtilSampler:
    def __init__(self, torch_index: int, interval_s: float):
        self.samples: List[int] = []
        self.reason: Optional[str] = None
        self._stop = threading.Event()
        self._thread = None
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = handle(pynvml, torch_index)
        except Exception as e:  # no driver, no GPU, no library: utilisation is absent, not zero
            self.reason = f"NVML unavailable ({type(e).__name__}: {e})"
            return
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True, name="nvml")
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            except Exception as e:   # the figure becomes absent with this reason, never silently stale
                self.reason = f"NVML sampling stopped ({type(e).__name__}: {e})"
                return

    def reset(self) -> None:
        """Forget what was sampled so far (warm-up, compile): the measured interval starts now."""
        self.samples = []

    def take(self) -> Optional[float]:
        """Mean utilisation (0..1) since the last call; None without NVML or samples."""
        if not self.samples:
            return None
        taken, self.samples = self.samples, []
        return sum(taken) / len(taken) / 100.0

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
