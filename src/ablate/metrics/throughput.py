"""Speed: tokens/s, TFLOP/s, MFU/HFU and the step time. Each log row's figures are its interval's, wall-clock; the
summary's come from the median steady step (steady.py: a stall moves them little, and is named in `stalls`), with
the wall-clock ones beside them (`tokens_per_s_wall`, `step_time_mean_s`). An MFU above 1.0 cannot happen: it is
removed (None) and kept in `invalid` with the reason; a bf16 MFU above the best published one is flagged, never
clamped.
"""
from __future__ import annotations

from typing import Dict, Optional

from ablate.metrics import flops as F
from ablate.metrics import steady
from ablate.metrics.collectors import BuiltIn, Span
from ablate.metrics.peak import Peak
from ablate.metrics.timing import StepTimes, synchronize

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


class Throughput(BuiltIn):
    def __init__(self, cfg, env, feeder, flop_model: F.FlopModel, layout, notes: Dict[str, str]):
        super().__init__()
        self.feeder, self.flop_model, self.notes = feeder, flop_model, notes
        self.layout = layout   # parallel/mesh.py: the ranks of one TP group share their tokens
        self.device, self.world_size, self.precision = env.device, env.world_size, cfg.precision.name
        self.peak = Peak(cfg, env.device, notes, env.rank)
        self.totals = dict(tokens=0, txl=0, flops=0.0, hw_flops=0.0, step_times=[])
        self.step_times = StepTimes(env.device, self.totals["step_times"])
        self.invalid: Dict[str, Dict[str, object]] = {}

    def resume(self, totals) -> None:
        super().resume(totals)
        self.step_times.durations = self.totals["step_times"]

    def step_begins(self, step: int) -> None:
        self.step_times.begin(step)

    def step_ends(self, grad_norm) -> None:
        self.step_times.end()

    def mark(self) -> None:
        self._tokens0, self._txl0 = self.feeder.tokens, self.feeder.tokens_x_len

    def logged(self) -> Dict[str, object]:
        self.step_times.take()   # CUDA events read while the device is synchronised
        return {}

    def interval(self, span: Span) -> Dict[str, object]:
        tokens, txl = self.feeder.tokens - self._tokens0, self.feeder.tokens_x_len - self._txl0
        fl = self.flop_model.training(tokens, txl)
        for key, value in (("tokens", tokens), ("txl", txl), ("flops", fl.model), ("hw_flops", fl.hardware)):
            self.totals[key] += value
        rates = self.rates(span, tokens, fl.model, fl.hardware)
        invalid_utilizations(rates, self.peak.source)
        return rates

    def rates(self, span: Span, tokens: int, model_flops: float, hw_flops: float) -> Dict[str, object]:
        """`tokens`: this rank's; the tp ranks of its group and the stages of its pipeline trained on the same
        tokens, so a device's share is 1/(tp x pp) of them and the job's rate is the data-parallel ranks' sum. No
        time measured (a run stopped inside its warm-up): every rate None."""
        if not span.seconds:
            return dict.fromkeys(("tokens_per_s", "tokens_per_s_per_device", "tflops_per_device", "step_time_s",
                                  "mfu", "hfu", "mfu_vs_measured_peak", "mfu_vs_datasheet_peak"))
        per_device = tokens / span.seconds / self.layout.model_ranks
        model_fpt, hw_fpt = model_flops / max(tokens, 1), hw_flops / max(tokens, 1)   # FLOPs per token
        return {"tokens_per_s": per_device * self.world_size, "tokens_per_s_per_device": per_device,
                "tflops_per_device": per_device * model_fpt / 1e12, "step_time_s": span.seconds / max(span.steps, 1),
                "mfu": F.utilization(per_device, model_fpt, self.peak.value),
                "hfu": F.utilization(per_device, hw_fpt, self.peak.value),
                "mfu_vs_measured_peak": F.utilization(per_device, model_fpt, self.peak.measured),
                "mfu_vs_datasheet_peak": F.utilization(per_device, model_fpt, self.peak.datasheet)}

    def summary(self, span: Span) -> Dict[str, object]:
        t = self.totals
        out = self.rates(span, t["tokens"], t["flops"], t["hw_flops"])
        out.update(tokens_per_s_wall=out["tokens_per_s"], step_time_mean_s=out["step_time_s"])
        synchronize(self.device)
        steps = steady.figures(self.step_times.take())
        if steps["step_time_s"]:   # the speed figures from the median step
            robust = self.rates(Span(steps["step_time_s"] * span.steps, span.steps), t["tokens"], t["flops"],
                                t["hw_flops"])
            out.update({k: robust[k] for k in STEADY_KEYS})
        out.update(steps)
        if steps["stalls"]:
            self.notes["step_time_s"] = f"the median steady step; {steady.describe(steps['stalls'])}"
        self.invalid.update(invalid_utilizations(out, self.peak.source))
        self.notes.update({k: v["reason"] for k, v in self.invalid.items()})
        out.update(self._flop_facts(out["tokens_per_s_per_device"]))
        out.update({**self.peak.record(), "invalid": self.invalid, "device_name": self.peak.device_name,
                    "tokens_per_step": t["tokens"] / span.steps * self.layout.dp if span.steps else None,
                    "measured_tokens": t["tokens"]})
        self._second_look(out)
        return out

    def _flop_facts(self, per_device: Optional[float]) -> Dict[str, object]:
        t = self.totals
        if not t["tokens"]:   # nothing measured (a run stopped inside its warm-up): the model's facts alone
            return {"flops_per_token": None, "hw_flops_per_token": None, "flops_per_token_6n": self.flop_model.six_n(),
                    "flops_source": self.flop_model.source, "mfu_convention": F.MFU_CONVENTION, "mfu_conventions": {},
                    "flops_per_token_full_recompute": None}
        return {
            "flops_per_token": t["flops"] / t["tokens"], "hw_flops_per_token": t["hw_flops"] / t["tokens"],
            "flops_per_token_6n": self.flop_model.six_n(), "flops_source": self.flop_model.source,
            "mfu_convention": F.MFU_CONVENTION,
            "mfu_conventions": {name: {"flops_per_token": fpt, "mfu": F.utilization(per_device, fpt, self.peak.value)}
                                for name, fpt in self.flop_model.conventions(t["tokens"], t["txl"]).items()},
            "flops_per_token_full_recompute": self.flop_model.full_recompute(t["tokens"], t["txl"]) / t["tokens"]}

    def _second_look(self, out: Dict[str, object]) -> None:
        """A bf16 dense MFU above the best published figure is flagged (a note), never clamped. Only against
        a datasheet or given peak: a measured peak (a CPU's GEMM probe) is this machine's own matmul rate,
        against which a high share is expected."""
        mfu = out.get("mfu")
        if mfu is not None and mfu > F.BEST_PUBLISHED_MFU and self.peak.source != "measured" \
                and self.precision == "bf16":
            out.setdefault("flags", {})["mfu"] = (
                f"MFU {mfu:.1%} ({F.MFU_CONVENTION}) is above the best published bf16 dense figure "
                f"({F.BEST_PUBLISHED_MFU:.0%}, Megatron-Core on H100): check the peak ({self.peak.source}) "
                "and the FLOP count before quoting it")
            self.notes["mfu"] = out["flags"]["mfu"]
