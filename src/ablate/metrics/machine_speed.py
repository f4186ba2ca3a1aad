"""The machine's own speed, per run: a shared or throttled host changes speed under the same load (this 2-core VM:
x1.5 between consecutive identical runs, no steal time, nothing else running), so a run's timings are judged
against how fast its machine was then. Rank 0 runs the calibration's own kernel (metrics/peak.py's GEMM probe,
its size, dtype and count; on a CPU in float32 whatever the run's dtype, against float32's calibration) as the
measured steps start (after warm-up, before their clock starts) and after the last, and summary.json's
`machine_speed` sets both rates beside the calibration's (the host's cached measured peak): `start_ratio`,
`end_ratio`, and `off` when either is more than OFF_BY from 1 (the report names such runs, as it names busy ones;
an A/A with one never becomes the noise floor). Absent, with the reason, where there is no calibration
(metrics.gemm_probe=false), on the other ranks, and for a run stopped inside its warm-up.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ablate.metrics import flops as F
from ablate.metrics.collectors import BuiltIn, Span
from ablate.metrics.peak import measured_peak
from ablate.precision import numerics

OFF_BY = 0.10        # a machine more than 10% off its calibration: the rule, the noise floor's too
PROBE_REPEATS = 10   # products timed after 3 warm-ups, as the calibration: ~0.1 s at its size on this CPU


class MachineSpeed(BuiltIn):
    def __init__(self, cfg, env, peak, notes: Dict[str, str]):
        super().__init__()
        self.device, self.main = env.device, env.is_main
        self.calibration: Optional[float] = (peak.probe or {}).get("flops")
        self.n = cfg.metrics.gemm_probe_n or (8192 if env.device.type == "cuda" else 1024)
        self.dtype = numerics(cfg.precision.name).probe_dtype
        if env.device.type == "cpu" and self.dtype != torch.float32 and self.calibration is not None:
            # a CPU multiplies bf16 and fp16 without their own kernels here (~1 GFLOP/s: a 1024 probe took 31 s, twice
            # a run); the machine's speed shows as well in float32's products, against float32's calibration
            self.dtype = torch.float32
            self.calibration = measured_peak(env.device, "cpu", self.dtype, self.n,
                                             cfg.metrics.peak_cache)["flops"] if self.main else None
        self.start_flops: Optional[float] = None
        if not cfg.metrics.gemm_probe:
            notes["machine_speed"] = "no calibration to compare with: metrics.gemm_probe=false"

    def start(self) -> None:
        """As the measured steps start (warm-up over: the process settled), before their clock starts."""
        if self.calibration is not None and self.main and self.start_flops is None:
            self.start_flops = self.probe()

    def probe(self) -> float:
        return F.gemm_probe(self.device, self.dtype, self.n, repeats=PROBE_REPEATS, warmup=3)[0]

    def summary(self, span: Span) -> Dict[str, object]:
        if self.calibration is None or not self.main or self.start_flops is None:   # (a run stopped in warm-up)
            return {"machine_speed": None}
        end = self.probe()
        ratios = [x / self.calibration for x in (self.start_flops, end)]
        return {"machine_speed": {
            "calibration_flops": self.calibration, "start_flops": self.start_flops, "end_flops": end,
            "start_ratio": ratios[0], "end_ratio": ratios[1], "off": any(abs(r - 1) > OFF_BY for r in ratios),
            "probe": f"{PROBE_REPEATS} {self.n}x{self.n}x{self.n} {str(self.dtype).replace('torch.', '')} products"}}

