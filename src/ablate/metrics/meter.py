"""The run's figures: the measuring window, and the built-in collectors that fill each log row and the summary.

A figure is one collector (metrics/collectors.py's `BuiltIn`), listed once in `built_in`: the loss and training's
health (health.py), speed and MFU (throughput.py), phases and data wait (timing.py), communication (comm.py),
memory (memory.py), GPU utilisation (gpu_util.py), a pipeline's bubble (bubble.py, pp > 1), a mixture of experts'
routing (experts.py), host load (host.py). The
meter keeps what they share: which
steps are measured - after `train.warmup_steps`, and not the steps the profiler traces (`metrics.profile_steps`);
summary.json says which were left out (`excluded_steps`) and how many counted (`measured_steps`) - and the
wall-clock seconds of each interval between log steps. The device is synchronised at log steps and at the edges
of the traced window only. Every key of the summary is always present: a figure that cannot be measured here is
None and `notes[key]` says why.
"""
from __future__ import annotations

import math
import time
from typing import Dict, List, Optional

import torch

from ablate.config import AblateConfig
from ablate.metrics.bubble import Bubble
from ablate.metrics.collectors import BuiltIn, Span
from ablate.metrics.comm import Comm
from ablate.metrics.experts import Experts, mixtures_of
from ablate.metrics.gpu_util import GpuUtil
from ablate.metrics.health import Health
from ablate.metrics.host import HostLoad
from ablate.metrics.machine_speed import MachineSpeed
from ablate.metrics.memory import Memory
from ablate.metrics.throughput import UTILIZATIONS, Throughput
from ablate.metrics.timing import DataWait, Phases, synchronize

# the figures a run whose loss ended non-finite did not train at (Meter._untrained); its step times stay measured
UNTRAINED = ("tokens_per_s", "tokens_per_s_per_device", "tflops_per_device", "tokens_per_s_wall", *UTILIZATIONS)
HOOKS = ("on_micro", "step_begins", "step_ends", "start", "mark", "interval", "logged", "summary", "close")


def built_in(cfg: AblateConfig, env, feeder, strategy, flop_model, layout, notes: Dict[str, str]) -> List[BuiltIn]:
    """ablate's own figures, one collector per concern, in the order their keys come in a log row."""
    throughput = Throughput(cfg, env, feeder, flop_model, layout, notes)
    # the machine's speed first: its probe at start precedes the other collectors' readings
    bubble = [Bubble(strategy.pipeline.clock, cfg.parallel)] if strategy.pipeline is not None else []
    experts = [Experts(env, strategy.model)] if any(mixtures_of(strategy.model)) else []
    return [MachineSpeed(cfg, env, throughput.peak, notes), Health(env, strategy), Memory(env.device, notes),
            throughput, DataWait(feeder), Phases(env.device), GpuUtil(env.device, cfg.metrics.nvml_interval_s, notes),
            Comm(strategy.comm, layout), *bubble, *experts, HostLoad()]


def _merge(into: Dict[str, object], got: Dict[str, object], source: str) -> None:
    clash = set(got) & set(into)
    if clash:
        raise RuntimeError(f"{source} gives {sorted(clash)}, which another collector gives")
    into.update(got)


class Meter:
    """Called by the loop without host syncs; read at log steps and at the end."""

    def __init__(self, cfg: AblateConfig, env, feeder, strategy, flop_model, layout,
                 totals: Optional[Dict[str, object]] = None):
        self.device, self.world_size, self.seq_len = env.device, env.world_size, cfg.train.seq_len
        self.notes: Dict[str, str] = {}
        self.collectors = built_in(cfg, env, feeder, strategy, flop_model, layout, self.notes)
        self.calls = {hook: [getattr(c, hook) for c in self.collectors if c.overrides(hook)] for hook in HOOKS}
        self.health, self.throughput, self.phases, self.comm, self.host = (
            self.of(kind) for kind in (Health, Throughput, Phases, Comm, HostLoad))
        self.window = dict(time=0.0, steps=0)   # the measured steps' wall-clock seconds and count
        for c in self.collectors:   # a resumed run: the figures cover every attempt's measured steps
            c.resume(totals or {})
        self.window.update({k: v for k, v in (totals or {}).items() if k in self.window})
        self.measuring = False
        # steps the figures leave out: warm-up, traced by the profiler, memory-tracked (metrics/step_memory.py)
        self.excluded: Dict[str, list] = {"warmup": [], "profiled": [], "memory_tracked": []}
        self._mark()

    def of(self, kind):
        return next(c for c in self.collectors if isinstance(c, kind))

    @property
    def totals(self) -> Dict[str, object]:
        """What a checkpoint keeps (one flat dict: a checkpoint of any earlier version resumes)."""
        out = dict(self.window)
        for c in self.collectors:
            out.update(c.totals)
        return out

    @property
    def clock(self):
        return self.phases.clock

    @property
    def step_times(self):
        return self.throughput.step_times

    # -- called by the training loop, no device sync -------------------------------------------
    def on_micro(self, loss: torch.Tensor) -> None:
        for call in self.calls["on_micro"]:
            call(loss)

    def step_begins(self, step: int) -> None:
        if self.measuring:
            for call in self.calls["step_begins"]:
                call(step)

    def on_step(self, grad_norm: Optional[torch.Tensor]) -> None:
        for call in self.calls["step_ends"]:
            call(grad_norm)
        if self.measuring:
            self.window["steps"] += 1

    def last_loss_finite(self) -> bool:
        return self.health.last_loss_finite()

    def consecutive_nonfinite(self) -> int:
        return self.health.consecutive_nonfinite()

    def start_measuring(self) -> None:
        """Warm-up is over: figures from here on count (the collectors' start, a probe among them, before the
        clock)."""
        synchronize(self.device)
        for call in self.calls["start"]:
            call()
        self._mark()
        self.measuring = True

    def exclude_from(self, step: int, why: str = "profiled") -> None:
        """A step that is not steady (traced by the profiler, memory-tracked) starts: the interval so far is
        counted, then nothing until `include_again`."""
        if step in self.excluded["warmup"]:
            return
        self.excluded[why].append(step)
        if self.measuring:
            synchronize(self.device)
            self._interval()
            self.measuring = False

    def include_again(self) -> None:
        if self.measuring or not (self.excluded["profiled"] or self.excluded["memory_tracked"]):
            return
        synchronize(self.device)
        self._mark()
        self.measuring = True

    # -- at log steps -----------------------------------------------------------------------------
    def _mark(self) -> None:
        self._t0, self._steps0 = time.perf_counter(), self.window["steps"]
        for call in self.calls["mark"]:
            call()

    def _interval(self) -> Dict[str, object]:
        """The interval of measured steps that ends here (the device synchronised): its figures, into the totals."""
        span = Span(time.perf_counter() - self._t0, self.window["steps"] - self._steps0)
        self.window["time"] += span.seconds
        return self._gather("interval", span)

    def log_point(self, step: int) -> Dict[str, object]:
        synchronize(self.device)
        speed = self._interval() if self.measuring else {}
        row: Dict[str, object] = {"step": step}
        _merge(row, self._gather("logged"), "logged")
        _merge(row, speed, "interval")
        self._mark()
        return row

    def _gather(self, hook: str, *args) -> Dict[str, object]:
        """Every collector's figures from `hook`; two giving one key is a bug (a figure is one collector's)."""
        out: Dict[str, object] = {}
        for call in self.calls[hook]:
            _merge(out, call(*args), f"{call.__self__.__class__.__name__}.{hook}")
        return out

    # -- end of run ---------------------------------------------------------------------------------
    def has_measured_steps(self) -> bool:
        return bool(self.window["steps"] and self.window["time"])

    def close_interval(self) -> None:
        """A run stopped between log steps (it diverged, a collector raised): the steps measured since the last log
        step count too."""
        if self.measuring:
            synchronize(self.device)
            self._interval()
            self._mark()

    def summary(self) -> Dict[str, object]:
        """The run's figures over its measured steps; a run stopped inside its warm-up has none: its timed figures
        are None, and notes say why."""
        if not self.has_measured_steps():
            why = "the run stopped inside its warm-up (train.warmup_steps): no steady step was measured"
            self.notes.update(dict.fromkeys(("tokens_per_s", "step_time_s", "mfu", "comm_bytes_per_step",
                                             "data_wait_frac"), why))
        out = self._gather("summary", Span(self.window["time"], self.window["steps"]))
        out.update({"world_size": self.world_size, "seq_len": self.seq_len, "measured_steps": self.window["steps"],
                    "excluded_steps": {k: list(v) for k, v in self.excluded.items()}})
        self._untrained(out)
        return out

    def _untrained(self, out: Dict[str, object]) -> None:
        """A run whose loss ended non-finite trained nothing in its last steps (fp16's scaler skipped them, or NaN
        flowed through): its rates and utilisations say how fast the machine ran, not how fast it trained, so
        they are kept as invalid, with the reason, not shown as figures."""
        loss = out.get("loss")
        if not out.get("nonfinite_steps") or (loss is not None and math.isfinite(loss)):
            return
        why = (f"the loss ended non-finite ({out['nonfinite_steps']} step(s) with a non-finite loss or gradient, "
               f"{out.get('scaler_skipped_steps') or 0} skipped by fp16's scaler): those steps trained nothing, so "
               "their speed is not training's")
        invalid = out.setdefault("invalid", {})
        for key in UNTRAINED:
            if out.get(key) is not None and key not in invalid:
                invalid[key] = {"value": out[key], "reason": why}
                out[key] = None
                self.notes[key] = why

    def slowest_before_comm(self, count: int = 8) -> List[List[float]]:
        return self.comm.slowest_before_comm(count)

    def long_gaps(self) -> List[tuple]:
        return self.comm.long_gaps

    def long_steps(self) -> List[tuple]:
        """The long steps' collective arrival times on this rank (metrics/comm.py): who held a stall up."""
        return self.comm.long_steps

    def close(self) -> None:
        for call in self.calls["close"]:
            call()
