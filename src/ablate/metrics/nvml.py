"""GPU utilisation as nvidia-smi reports it, sampled by NVML in a background thread.

"Utilisation" is the share of time a kernel was running, not how much of the GPU it used: a GPU
waiting on a tiny kernel or a spinning NCCL kernel reads 100%. Logging it beside MFU shows that gap.
"""
from __future__ import annotations

import threading
from typing import List, Optional


class UtilSampler:
    def __init__(self, device_index: int, interval_s: float):
        self.samples: List[int] = []
        self.reason: Optional[str] = None
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception as e:  # no driver, no GPU, no library: utilisation is absent, not zero
            self.reason = f"NVML unavailable ({type(e).__name__}: {e})"
            return
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True, name="nvml")
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

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
