"""metrics.profile_steps=[start, count]: torch.profiler over those training steps, one trace per rank
(<run dir>/traces/rank{N}.json.gz: open it in https://ui.perfetto.dev or chrome://tracing), and the
exposed-communication figures of overlap.py read back from it. Off by default: profiling costs time."""
from __future__ import annotations

import gzip
import os
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch

from ablate.console import library_output_to_log
from ablate.metrics import overlap

FIGURES = ("comm_exposed_s", "comm_overlap_frac", "comm_s", "compute_s", "data_wait_s", "data_exposed_s", "idle_s")
NOT_PROFILED = "not profiled: set metrics.profile_steps=[start, count] to trace a few steps and measure it"


class StepProfiler:
    """Starts before the first step; `step()` after every training step; figures once the trace is in."""

    def __init__(self, spec, device: torch.device, run_dir: Path, rank: int, is_main: bool):
        self.result: Optional[Dict] = None
        self.path = run_dir / "traces" / f"rank{rank}.json.gz"
        self.is_main, self.prof, self.window = is_main, None, None
        if not spec:
            return
        start, count = int(spec[0]), int(spec[1])
        self.window = (start, count)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # profiler step k covers training step k + 1: warm up one step, then record steps start..start+count-1
        warmup = 1 if start >= 2 else 0
        schedule = torch.profiler.schedule(skip_first=max(start - 1 - warmup, 0), wait=0, warmup=warmup,
                                           active=count, repeat=1)
        self.prof = torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=self._ready)
        self.run_dir = run_dir
        with library_output_to_log(run_dir):      # Kineto's USDT lines go to the run's log
            self.prof.start()

    def traced_steps(self, first_step: int) -> List[int]:
        """The training steps the trace records, counted from this attempt's first step (1 when fresh)."""
        if self.window is None:
            return []
        start, count = self.window
        return list(range(first_step + start - 1, first_step + start - 1 + count))

    def step(self) -> None:
        if self.prof is None:
            return
        if self.result is not None:      # the trace is in: nothing left to say, no redirect per step
            self.prof.step()
            return
        with library_output_to_log(self.run_dir):
            self.prof.step()
        if self.result is not None and self.is_main:
            print(f"trace: {self.path} (open in https://ui.perfetto.dev or chrome://tracing)", file=sys.stderr)

    def _ready(self, prof) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        raw = self.path.with_suffix("")          # rank0.json
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(self.path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        self.result = overlap.analyze(overlap.load(self.path))
        for s in self.result["steps"]:
            s["step"] += 1                        # the profiler counts from 0: name the training step

    def figures(self) -> Dict[str, Optional[float]]:
        mean = (self.result or {}).get("mean", {})
        return {k: mean.get(k) for k in FIGURES}

    def close(self) -> None:
        if self.prof is not None:
            with library_output_to_log(self.run_dir):
                self.prof.stop()
            self.prof = None

    def record(self) -> Optional[Dict]:
        """summary.json's `profile`: the trace and every profiled step."""
        if self.result is None:
            return None
        return {"trace": str(self.path), "device": self.result["device"], "steps": self.result["steps"],
                "definition": overlap.__doc__.split("\n\n")[1]}
