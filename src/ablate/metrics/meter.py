"""The run's figures: interval accounting at log steps, and the end-of-run summary.

Speed figures cover only steady steps: after `train.warmup_steps`, and not the steps the profiler traces
(`metrics.profile_steps`); summary.json says which were left out (`excluded_steps`) and how many counted
(`measured_steps`). The summary's speed figures (tokens/s, step time, TFLOP/s, MFU/HFU) come from the
median steady step (steady.py: a stall moves them little, and is named in `stalls`); shares of time
(data wait, phases) and the per-interval rows of metrics.jsonl are wall-clock. The device is
synchronised at log steps and at the edges of the traced window only.
Every key of the summary is always present: a figure that cannot be measured here is None and
`notes[key]` says why.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import torch

from ablate.config import AblateConfig
from ablate.metrics import flops as F
from ablate.metrics import memory, steady
from ablate.metrics.comm import mean_across_ranks
from ablate.metrics.host import HostLoad
from ablate.metrics.peak import Peak
from ablate.metrics.timing import PhaseClock, StepTimes, synchronize
from ablate.nvml import UtilSampler

UTILIZATIONS = ("mfu", "hfu", "mfu_vs_measured_peak", "mfu_vs_datasheet_peak")
STEADY_KEYS = ("tokens_per_s", "tokens_per_s_per_device", "tflops_per_device", "step_time_s") + UTILIZATIONS


def invalid_utilizations(figures: Dict[str, object], peak_source: Optional[str]) -> Dict[str, Dict[str, object]]:
    """MFU/HFU above 1.0 cannot happen: such a figure is removed (None) and kept here with the reason."""
    out = {}
    for key in UTILIZATIONS:
        value = figures.get(key)
        if value is not None and value > 1.0:
            out[key] = {"value": value, "reason": f"{value:.0%} > 100% is impossible: the peak ({peak_source}) "
                                                  "is below what the run achieved; the figure is not valid"}
            figures[key] = None
    return out


class Meter:
    """The run's figures: called by the loop without host syncs, read at log steps and at the end."""

    def __init__(self, cfg: AblateConfig, env, feeder, strategy, flop_model: F.FlopModel, layout,
                 totals: Optional[Dict[str, float]] = None):
        self.cfg, self.env, self.device, self.world_size = cfg, env, env.device, env.world_size
        self.layout = layout   # parallel/mesh.py: the ranks of one TP group share their tokens
        self.flop_model = flop_model
        self.host = HostLoad()
        self.peak_rss = memory.PeakRss()
        device = self.device
        self.feeder, self.strategy = feeder, strategy
        self.notes: Dict[str, str] = {}
        self.peak = Peak(cfg, device, self.notes, env.rank)
        self.clock = PhaseClock(device)
        self.nvml = UtilSampler(device.index or 0, cfg.metrics.nvml_interval_s) if device.type == "cuda" else None
        if self.nvml is None or self.nvml.reason:
            self.notes["gpu_util"] = self.nvml.reason if self.nvml else "no GPU: NVML utilisation does not apply"
        if device.type != "cuda":
            self.notes["fragmentation"] = memory.NO_CUDA_REASON
            self.notes["mem_reserved_bytes"] = "no CUDA caching allocator on a CPU; mem_peak_bytes is peak RSS"
        self.loss_sum = torch.zeros((), device=device)
        self.loss_count = 0
        self.nonfinite = torch.zeros((), dtype=torch.int64, device=device)
        self._step_bad = torch.zeros((), dtype=torch.bool, device=device)      # this step had a NaN/inf
        self._consecutive = torch.zeros((), dtype=torch.int64, device=device)  # bad steps in a row
        self._last_loss_bad = torch.zeros((), dtype=torch.bool, device=device)  # the last step's loss was NaN/inf
        self.grad_norm = torch.zeros((), device=device)
        self.measuring = False
        self.excluded: Dict[str, list] = {"warmup": [], "profiled": []}   # steps the figures leave out
        self.invalid: Dict[str, Dict[str, object]] = {}
        self.totals = dict(time=0.0, steps=0, tokens=0, txl=0, flops=0.0, hw_flops=0.0, wait=0.0, copy=0.0,
                           fwd_bwd=0.0, optimizer=0.0, comm_bytes=0, comm_calls=0, comm_by_dim={}, step_times=[])
        if totals:   # a resumed run: the figures cover every attempt's measured steps
            self.totals.update({k: v for k, v in totals.items() if k in self.totals})
        self.step_times = StepTimes(device, self.totals["step_times"])
        self.before_comm: list = []          # per measured step: (step, host seconds before its first collective)
        self._step = 0
        self._host_t0: Optional[float] = None
        self.last: Dict[str, object] = {}
        self.util_samples = []
        self.mem_max: Dict[str, Optional[int]] = {}
        self._mark()

    # -- called by the training loop, no device sync -------------------------------------------
    def on_micro(self, loss: torch.Tensor) -> None:
        loss = loss.detach()
        bad = ~torch.isfinite(loss)
        self.nonfinite += bad.long()
        self._step_bad |= bad
        self.loss_sum += loss
        self.loss_count += 1

    def step_begins(self, step: int) -> None:
        self._step = step
        if self.measuring:
            self.step_times.begin(step)
            self.strategy.comm.first_at = None       # the step's first collective is stamped by the counter
            self._host_t0 = time.perf_counter()

    def on_step(self, grad_norm: Optional[torch.Tensor]) -> None:
        """`grad_norm` None: the engine did not measure one (then only the loss says a step was bad)."""
        self.step_times.end()
        if self._host_t0 is not None:   # work before the first collective (steady.py: stragglers)
            self.before_comm.append((self._step, (self.strategy.comm.first_at or time.perf_counter()) - self._host_t0))
            self._host_t0 = None
        self.grad_norm = grad_norm.detach() if grad_norm is not None else None
        bad = self._step_bad if grad_norm is None else self._step_bad | ~torch.isfinite(self.grad_norm)
        self._consecutive = torch.where(bad, self._consecutive + 1, torch.zeros_like(self._consecutive))
        self._last_loss_bad = self._step_bad   # the step's own loss: fp16's skipped steps keep finite weights
        self._step_bad = torch.zeros_like(self._step_bad)
        if self.measuring:
            self.totals["steps"] += 1

    def last_loss_finite(self) -> bool:
        """The last step's loss was finite on this rank (a host sync): a checkpoint is good only then."""
        return not bool(self._last_loss_bad.item())

    def consecutive_nonfinite(self) -> int:
        """Steps in a row, up to the last, with a non-finite loss or gradient norm (a host sync)."""
        return int(self._consecutive.item())

    def start_measuring(self) -> None:
        """Warm-up is over: figures from here on count."""
        synchronize(self.device)
        self._mark()
        self.clock.take()
        if self.nvml:
            self.nvml.reset()        # utilisation of the measured steps only, not of warm-up or compile
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)   # peaks of the measured steps only
        self.host.start()
        self.measuring = True

    def exclude_from(self, step: int) -> None:
        """A step that is not steady (traced by the profiler) starts: the interval so far is counted, then
        nothing until `include_again`."""
        if step in self.excluded["warmup"]:
            return
        self.excluded["profiled"].append(step)
        if self.measuring:
            synchronize(self.device)
            self._speed(time.perf_counter() - self._t0, self.clock.take())
            self.measuring = False

    def include_again(self) -> None:
        if self.measuring or not self.excluded["profiled"]:
            return
        synchronize(self.device)
        self._mark()
        self.clock.take()
        self.measuring = True

    # -- at log steps -----------------------------------------------------------------------------
    def _mark(self) -> None:
        self._t0 = time.perf_counter()
        self._tokens0, self._txl0 = self.feeder.tokens, self.feeder.tokens_x_len
        self._wait0, self._copy0 = self.feeder.wait_s, self.feeder.copy_s
        self._comm0 = (self.strategy.comm.bytes, self.strategy.comm.calls)
        self._by_dim0 = dict(self.strategy.comm.by_dim)
        self._steps0 = self.totals["steps"]

    def log_point(self, step: int) -> Dict[str, object]:
        synchronize(self.device)
        elapsed = time.perf_counter() - self._t0
        phases = self.clock.take()
        self.step_times.take()
        loss = mean_across_ranks(self.loss_sum / max(self.loss_count, 1), self.env)
        row: Dict[str, object] = {"step": step, "loss": loss.item(),
                                  "grad_norm": self.grad_norm.item() if self.grad_norm is not None else None,
                                  "nonfinite_steps": int(self.nonfinite.item()),
                                  "scaler_skipped_steps": self.strategy.skipped_steps(),
                                  "loss_scale": self.strategy.loss_scale()}
        self.loss_sum.zero_()
        self.loss_count = 0
        mem = memory.interval(self.device, self.peak_rss)
        for k, v in mem.items():   # whole-run peaks: the max over intervals
            if k.endswith(".peak") or k in ("mem_peak_bytes", "mem_reserved_bytes"):
                self.mem_max[k] = max(self.mem_max.get(k) or 0, v or 0) if v is not None else None
        row.update(mem)
        if self.measuring:
            row.update(self._speed(elapsed, phases))
        self._mark()
        self.last = row
        return row

    def _speed(self, elapsed: float, phases: Dict[str, float]) -> Dict[str, object]:
        tokens = self.feeder.tokens - self._tokens0
        fl = self.flop_model.training(tokens, self.feeder.tokens_x_len - self._txl0)
        steps = self.totals["steps"] - self._steps0
        wait, copy = self.feeder.wait_s - self._wait0, self.feeder.copy_s - self._copy0
        comm_bytes, comm_calls = (self.strategy.comm.bytes - self._comm0[0], self.strategy.comm.calls - self._comm0[1])
        txl = self.feeder.tokens_x_len - self._txl0
        by_dim = self.totals["comm_by_dim"]
        for dim, n in self.strategy.comm.by_dim.items():
            by_dim[dim] = by_dim.get(dim, 0) + n - self._by_dim0.get(dim, 0)
        for k, v in (("time", elapsed), ("tokens", tokens), ("txl", txl), ("flops", fl.model),
                     ("hw_flops", fl.hardware),
                     ("wait", wait), ("copy", copy), ("fwd_bwd", phases.get("fwd_bwd", 0.0)),
                     ("optimizer", phases.get("optimizer", 0.0)), ("comm_bytes", comm_bytes),
                     ("comm_calls", comm_calls)):
            self.totals[k] += v
        util = self.nvml.take() if self.nvml else None
        if util is not None:
            self.util_samples.append(util)
        rates = self._rates(elapsed, steps, tokens, fl.model, fl.hardware, wait, copy, phases)
        invalid_utilizations(rates, self.peak.source)
        return {**rates, "gpu_util": util,
                "comm_bytes_per_step": comm_bytes / max(steps, 1), "comm_calls_per_step": comm_calls / max(steps, 1)}

    def _rates(self, elapsed, steps, tokens, model_flops, hw_flops, wait, copy, phases) -> Dict[str, object]:
        """`tokens`: this rank's; the tp ranks of its group trained on the same tokens, so a device's share is 1/tp
        of them and the job's rate is the data-parallel ranks' sum."""
        per_device = tokens / elapsed / self.layout.tp
        model_fpt, hw_fpt = model_flops / max(tokens, 1), hw_flops / max(tokens, 1)   # FLOPs per token
        out = {"tokens_per_s": per_device * self.world_size, "tokens_per_s_per_device": per_device,
               "tflops_per_device": per_device * model_fpt / 1e12, "step_time_s": elapsed / max(steps, 1),
               "mfu": F.utilization(per_device, model_fpt, self.peak.value),
               "hfu": F.utilization(per_device, hw_fpt, self.peak.value),
               "mfu_vs_measured_peak": F.utilization(per_device, model_fpt, self.peak.measured),
               "mfu_vs_datasheet_peak": F.utilization(per_device, model_fpt, self.peak.datasheet),
               "data_wait_frac": wait / elapsed, "time/data_wait_s": wait / max(steps, 1),
               "time/h2d_copy_s": copy / max(steps, 1)}
        for phase in ("fwd_bwd", "optimizer"):
            out[f"time/{phase}_s"] = phases.get(phase, 0.0) / max(steps, 1)
        return out

    # -- end of run ---------------------------------------------------------------------------------
    def summary(self) -> Dict[str, object]:
        t = self.totals
        if not t["steps"] or not t["time"]:
            raise RuntimeError("no measured steps: the run ended inside its warm-up")
        phases = {"fwd_bwd": t["fwd_bwd"], "optimizer": t["optimizer"]}
        out = self._rates(t["time"], t["steps"], t["tokens"], t["flops"], t["hw_flops"], t["wait"], t["copy"], phases)
        out.update(tokens_per_s_wall=out["tokens_per_s"], step_time_mean_s=out["step_time_s"])
        synchronize(self.device)
        steps = steady.figures(self.step_times.take())
        if steps["step_time_s"]:   # the speed figures from the median step; shares of time stay wall-clock
            robust = self._rates(steps["step_time_s"] * t["steps"], t["steps"], t["tokens"], t["flops"],
                                 t["hw_flops"], t["wait"], t["copy"], phases)
            out.update({k: robust[k] for k in STEADY_KEYS})
        out.update(steps, compute_before_comm_s=steady.median_or_none([s for _, s in self.before_comm]))
        if steps["stalls"]:
            self.notes["step_time_s"] = f"the median steady step; {steady.describe(steps['stalls'])}"
        self.invalid.update(invalid_utilizations(out, self.peak.source))
        self.notes.update({k: v["reason"] for k, v in self.invalid.items()})
        seq = self.cfg.train.seq_len
        out.update({
            "flops_per_token": t["flops"] / t["tokens"], "hw_flops_per_token": t["hw_flops"] / t["tokens"],
            "flops_per_token_6n": self.flop_model.six_n(), "flops_source": self.flop_model.source,
            "mfu_convention": F.MFU_CONVENTION,
            "mfu_conventions": {name: {"flops_per_token": fpt, "mfu": F.utilization(out["tokens_per_s_per_device"],
                                                                                    fpt, self.peak.value)}
                                for name, fpt in self.flop_model.conventions(t["tokens"], t["txl"]).items()},
            "flops_per_token_full_recompute":
                self.flop_model.full_recompute(t["tokens"], t["txl"]) / t["tokens"],
            **self.peak.record(), "invalid": self.invalid,
            "device_name": self.peak.device_name, "world_size": self.world_size,
            "gpu_util": sum(self.util_samples) / len(self.util_samples) if self.util_samples else None,
            "comm_bytes_per_step": t["comm_bytes"] / t["steps"],
            "comm_calls_per_step": t["comm_calls"] / t["steps"],
            "comm_bytes_by_dim": {d: t["comm_by_dim"].get(d, 0) / t["steps"] for d in self.layout.active_dims()},
            "tokens_per_step": t["tokens"] / t["steps"] * self.layout.dp,
            "nonfinite_steps": int(self.nonfinite.item()), "scaler_skipped_steps": self.strategy.skipped_steps(),
            "loss_scale": self.strategy.loss_scale(), "measured_steps": t["steps"],
            "excluded_steps": {k: list(v) for k, v in self.excluded.items()},
            "measured_tokens": t["tokens"], "seq_len": seq,
        })
        out.update(self._memory_summary())
        out["loss"] = self.last.get("loss")
        self._second_look(out)
        return out

    def _second_look(self, out: Dict[str, object]) -> None:
        """A bf16 dense MFU above the best published figure is flagged (a note), never clamped. Only against
        a datasheet or given peak: a measured peak (a CPU's GEMM probe) is this machine's own matmul rate,
        against which a high share is expected."""
        mfu = out.get("mfu")
        if mfu is not None and mfu > F.BEST_PUBLISHED_MFU and self.peak.source != "measured" \
                and self.cfg.precision.name == "bf16":
            out.setdefault("flags", {})["mfu"] = (
                f"MFU {mfu:.1%} ({F.MFU_CONVENTION}) is above the best published bf16 dense figure "
                f"({F.BEST_PUBLISHED_MFU:.0%}, Megatron-Core on H100): check the peak ({self.peak.source}) "
                "and the FLOP count before quoting it")
            self.notes["mfu"] = out["flags"]["mfu"]

    def _memory_summary(self) -> Dict[str, object]:
        m = self.mem_max
        out = {"mem_peak_bytes": m.get("mem_peak_bytes"), "mem_reserved_bytes": m.get("mem_reserved_bytes")}
        if self.device.type == "cuda":
            stats = {k[len("mem/"):]: v for k, v in m.items() if k.startswith("mem/")}
            out.update(memory.fragmentation(stats))
            out.update({f"mem_{k.split('.')[0]}": v for k, v in stats.items()})
            out["mem_num_alloc_retries"] = self.last.get("mem/num_alloc_retries")
            out["mem_num_ooms"] = self.last.get("mem/num_ooms")
        else:
            out.update({"fragmentation": None, "inactive_split_frac": None})
        return out

    def slowest_before_comm(self, count: int = 8) -> List[List[float]]:
        """This rank's longest waits before its first collective, [step, seconds]: who held a stall up."""
        return [list(p) for p in sorted(self.before_comm, key=lambda p: p[1], reverse=True)[:count]]

    def close(self) -> None:
        if self.nvml:
            if self.nvml.reason and not self.util_samples:
                self.notes["gpu_util"] = self.nvml.reason
            self.nvml.close()
