"""The registry of figures (FIGURES: each declared once, with its kind, unit, better direction, scale and
views) and one way to write a figure for people: with its unit and thousands separators, never an exponent.
The console, summary tables, report, effects, plots and the regression gate all read it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

# views a figure can appear in: the console's summary table, the report's arm table, a grid's per-cell table,
# the effects a factorial estimates, the regression gate's comparisons
VIEWS = ("console", "arm", "cell", "effect", "gate")


@dataclass(frozen=True)
class Figure:
    """One figure, declared once: how it is written (kind, unit), which way is better, how its effects and
    intervals are taken (scale: `log` = ratios, `linear` = differences), whether identical configurations give
    it exactly (counted, not timed), and the views that show it (in this registry's order)."""
    name: str
    kind: str                       # rate | time | share | bytes | count | flops | plain
    unit: str = ""
    better: Optional[str] = None    # higher | lower | None (no direction: a loss, a count)
    scale: str = "log"
    exact: bool = False
    views: Tuple[str, ...] = ()
    means: str = ""                 # its one-line definition (docs/records.md's table of figures)


def _declare(*figures: Figure) -> Dict[str, Figure]:
    for f in figures:
        assert set(f.views) <= set(VIEWS) and f.scale in ("log", "linear") and f.means, f
    return {f.name: f for f in figures}


# One entry per figure: a new figure is one line here, and reads the same in every view; docs/records.md's table
# of figures is rendered from it (`python -m ablate.units`)
FIGURES = _declare(
    Figure("loss", "plain", views=("console", "arm", "cell"),
           means="next-token cross-entropy: a log row's mean over its micro-batches and ranks; the run's: the last "
                 "row's"),
    Figure("tokens_per_s", "rate", "tok/s", "higher", views=("console", "arm", "cell", "effect", "gate"),
           means="tokens trained per second by all ranks, from the median steady step"),
    Figure("tokens_per_s_per_device", "rate", "tok/s", "higher", means="tokens_per_s over the devices"),
    Figure("step_time_s", "time", "s", "lower", views=("console", "effect", "gate"),
           means="the median steady optimizer step, first micro-batch to optimizer step (warm-up, traced steps out)"),
    Figure("tflops_per_device", "rate", "TFLOP/s", "higher", views=("console",),
           means="model FLOPs per second per device at the median step"),
    Figure("mfu", "share", "%", "higher", views=("console", "arm", "cell", "gate"),
           means="achieved model FLOP/s per device over `peak_flops` (its source: `peak_flops_source`)"),
    # MFU against the sweep's common peak: its ratio between arms is their speed ratio, so it is taken as one
    Figure("mfu_common_peak", "share", "%", "higher", views=("arm", "effect"),
           means="in a report: every arm's MFU over the baseline's peak (a speed ratio between precisions)"),
    Figure("hfu", "share", "%", "higher", views=("console",),
           means="as mfu, counting what activation checkpointing recomputes (hw_flops_per_token)"),
    Figure("mfu_vs_measured_peak", "share", "%", "higher", means="MFU over this machine's measured GEMM peak"),
    Figure("mfu_vs_datasheet_peak", "share", "%", "higher", means="MFU over the device's datasheet peak"),
    Figure("peak_flops_source", "plain", views=("console",),
           means="the MFU denominator's source: override > datasheet > measured (a GEMM probe in the run's dtype)"),
    Figure("data_wait_frac", "share", "%", "lower", "linear", views=("console", "arm", "effect"),
           means="host time blocked on the loader over the step time"),
    Figure("mem_peak_bytes", "bytes", better="lower", views=("console", "arm", "cell", "effect", "gate"),
           means="CUDA: peak allocated; CPU: the process's peak RSS"),
    Figure("mem_reserved_bytes", "bytes", better="lower", views=("console",),
           means="CUDA: peak reserved by the caching allocator; null on a CPU"),
    Figure("fragmentation", "share", "%", "lower", "linear", views=("console",),
           means="1 - active_bytes.all.peak / reserved_bytes.all.peak (CUDA); null on a CPU"),
    Figure("inactive_split_frac", "share", "%", "lower", "linear",
           means="the allocator's inactive split blocks over reserved (CUDA); null on a CPU"),
    Figure("gpu_util", "share", "%", "higher", "linear", views=("console",),
           means="NVML utilisation (nvidia-smi's busy), sampled in a thread"),
    Figure("comm_overlap_frac", "share", "%", "higher", "linear",
           means="|comm ∩ compute| / |comm| over the traced steps (metrics.profile_steps)"),
    Figure("comm_bytes_per_step", "bytes", better="lower", exact=True,
           views=("console", "arm", "cell", "effect", "gate"),
           means="bytes the strategy's collectives moved per optimizer step (payload: the full buffer)"),
    Figure("comm_calls_per_step", "count", "calls/step", "lower", exact=True,
           views=("console", "cell", "effect", "gate"), means="the strategy's collectives per optimizer step"),
    Figure("flops_per_token", "flops", "FLOP/token", exact=True, views=("gate",),
           means="model FLOPs per trained token: 6N + the LM head + full attention (torchtitan's), or counted"),
    Figure("nonfinite_steps", "count", "steps", "lower", views=("console", "arm"),
           means="optimizer steps whose loss was not finite"),
    Figure("scaler_skipped_steps", "count", "steps", "lower", views=("console", "arm"),
           means="optimizer steps fp16's GradScaler skipped for overflow"),
    Figure("loss_scale", "plain", means="fp16's loss scale at the end"),
    Figure("grad_norm", "plain", means="the gradients' total norm at the last step"),
    # shown by no view of their own; declared so that a search can aim at them (ablate.tune --objective)
    Figure("step_time_p90_s", "time", "s", "lower", means="the 90th percentile steady step"),
    Figure("step_time_mean_s", "time", "s", "lower",
           means="wall clock over the measured steps per step: stalls, log steps and checkpoints included"),
    Figure("tokens_per_s_wall", "rate", "tok/s", "higher", means="tokens over the measured steps' wall clock"),
    Figure("stall_s", "time", "s", "lower", means="the time of steps over 10x the median beyond the median"),
    Figure("compute_before_comm_s", "time", "s", "lower",
           means="the median host time from a step's start to its first collective (data and compute)"),
    Figure("activation_bytes", "bytes", better="lower", views=("arm", "effect"),
           means="what autograd saved for backward at the first micro-step"),
    Figure("peak_bytes_measured", "bytes", better="lower", views=("console", "arm", "cell", "effect"),
           means="the most tensor memory live at once in one full optimizer step, on the most loaded rank"),
    Figure("peak_bytes_planned", "bytes", better="lower", views=("arm",),
           means="the plan's peak tensor bytes per rank for this run (model/peak.py)"),
    Figure("peak_ratio", "plain", views=("arm",), means="peak_bytes_measured / peak_bytes_planned"),
    Figure("hw_flops_per_token", "flops", "FLOP/token",
           means="flops_per_token + what activation checkpointing recomputes"),
    # a pipeline's (parallel.pp > 1): the fraction of a step its ranks wait, measured and as its schedule expects
    Figure("pp_bubble", "share", "%", "lower", "linear", views=("console", "arm"),
           means="the fraction of a step a pipeline's rank waits in its schedule (the ranks' mean)"),
    Figure("pp_bubble_expected", "share", "%", "lower", "linear", views=("arm",),
           means="the bubble the pipeline's schedule leaves with equal stages"),
    # a mixture of experts' (metrics/experts.py)
    Figure("moe_load_imbalance", "plain", better="lower", views=("console", "arm", "effect"),
           means="the most loaded expert's slots over the mean expert's, per mixture, over every rank (1 = even)"),
    Figure("moe_dropped_frac", "share", "%", "lower", "linear", views=("console", "arm", "effect"),
           means="the (token, expert) slots a capacity factor dropped, of all routed"),
    Figure("moe_aux_loss", "plain", views=("console", "arm"),
           means="the balance losses the mixtures added to the loss, the mean over micro-batches and ranks"),
    Figure("params_active", "count", "params", means="the parameters one token meets: k of each mixture's experts"),
)


def render() -> str:
    """docs/records.md's table of figures, from FIGURES (tests/test_docs.py holds the page to it)."""
    rows = ["| figure | unit | better | exact | means |", "|---|---|---|---|---|"]
    for f in FIGURES.values():
        shown = {"bytes": "bytes", "share": "%"}.get(f.kind, f.unit) or "—"
        rows.append(f"| `{f.name}` | {shown} | {f.better or '—'} | {'yes' if f.exact else ''} | {f.means} |")
    return "\n".join(rows) + "\n"


def in_view(view: str) -> Tuple[str, ...]:
    """The figures a view shows, in the registry's order."""
    assert view in VIEWS, view
    return tuple(name for name, f in FIGURES.items() if view in f.views)


def on_log_scale(metric: str) -> bool:
    """Effects and intervals of this figure as ratios (a rate, a size, MFU) or as differences (a share of time)."""
    declared = FIGURES.get(metric)
    return declared.scale == "log" if declared else not is_fraction(metric)


def is_exact(metric: str) -> bool:
    """Identical configurations give it exactly (counted, not timed): compared as equal or not, no interval."""
    declared = FIGURES.get(metric)
    return bool(declared and declared.exact)


BYTE_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def is_fraction(metric: str) -> bool:
    """A share (written as %): declared so, or named `..._frac` (per-rank and phase figures)."""
    declared = FIGURES.get(metric)
    return declared.kind == "share" if declared else metric.endswith("_frac")


def unit(metric: str, magnitude: float = 1e9) -> Tuple[str, float]:
    """(unit label, divisor): the registry's declaration first, then by the name's kind (figures not declared:
    per-rank and phase figures); bytes pick a decimal unit that fits `magnitude`."""
    declared = FIGURES.get(metric)
    if is_fraction(metric):
        return "%", 0.01
    if (declared.kind == "bytes") if declared else "bytes" in metric:
        return next(((u, s) for u, s in BYTE_UNITS if abs(magnitude) >= s), ("B", 1.0))
    if declared:
        return declared.unit, 1.0
    if "flops_per_token" in metric:
        return "FLOP/token", 1.0
    if metric.endswith("_per_s"):
        return "/s", 1.0
    if metric.endswith("_s"):
        return "s", 1.0
    if metric.endswith("_steps"):
        return "steps", 1.0
    if metric.endswith("calls_per_step"):
        return "calls/step", 1.0
    return "", 1.0


def number(value: float) -> str:
    """Plain digits with separators: 4 significant digits below 1000, whole numbers above; NaN and inf as such (a
    diverged run's figures)."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}" if abs(value) >= 1e-4 else f"{value:.2g}"


def fmt(metric: str, value: Optional[object]) -> str:
    """A figure with its unit: '33.6%', '350.9 MB', '42,100 tok/s', '—' for none."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    label, div = unit(metric, value)
    if label == "%":
        return f"{value * 100:.3g}%" if abs(value) < 0.1 else f"{value * 100:.1f}%"
    text = number(value / div) if div == 1.0 else f"{value / div:,.1f}"
    return f"{text} {label}".strip()


def effect(kind: str, value: Optional[float], metric: str = "") -> str:
    """An effect in its own kind: '-87.5%' (reduction), 'x2.2' (ratio), '+1.5 pp' (difference of
    shares), or the level itself ('= 0', '2.1%')."""
    if value is None:
        return "—"
    if kind == "reduction":
        return f"{-value * 100:+.1f}%".replace("-", "−")
    if kind == "ratio":
        return f"x{value:.3g}"
    if kind == "difference":
        return f"{value * 100:+.2g} pp" if is_fraction(metric) else f"{value:+.4g}"
    return "= 0" if value == 0 else fmt(metric, value)


if __name__ == "__main__":
    print(render(), end="")
