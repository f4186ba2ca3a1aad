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


def _declare(*figures: Figure) -> Dict[str, Figure]:
    for f in figures:
        assert set(f.views) <= set(VIEWS) and f.scale in ("log", "linear"), f
    return {f.name: f for f in figures}


# One entry per figure: a new figure is one line here, and reads the same in every view.
FIGURES = _declare(
    Figure("loss", "plain", views=("console", "arm", "cell")),
    Figure("tokens_per_s", "rate", "tok/s", "higher", views=("console", "arm", "cell", "effect", "gate")),
    Figure("tokens_per_s_per_device", "rate", "tok/s", "higher"),
    Figure("step_time_s", "time", "s", "lower", views=("console", "effect", "gate")),
    Figure("tflops_per_device", "rate", "TFLOP/s", "higher", views=("console",)),
    Figure("mfu", "share", "%", "higher", views=("console", "arm", "cell", "gate")),
    # MFU against the sweep's common peak: its ratio between arms is their speed ratio, so it is taken as one
    Figure("mfu_common_peak", "share", "%", "higher", views=("arm", "effect")),
    Figure("hfu", "share", "%", "higher", views=("console",)),
    Figure("mfu_vs_measured_peak", "share", "%", "higher"),
    Figure("mfu_vs_datasheet_peak", "share", "%", "higher"),
    Figure("peak_flops_source", "plain", views=("console",)),
    Figure("data_wait_frac", "share", "%", "lower", "linear", views=("console", "arm", "effect")),
    Figure("mem_peak_bytes", "bytes", better="lower", views=("console", "arm", "cell", "effect", "gate")),
    Figure("mem_reserved_bytes", "bytes", better="lower", views=("console",)),
    Figure("fragmentation", "share", "%", "lower", "linear", views=("console",)),
    Figure("inactive_split_frac", "share", "%", "lower", "linear"),
    Figure("gpu_util", "share", "%", "higher", "linear", views=("console",)),
    Figure("comm_overlap_frac", "share", "%", "higher", "linear"),
    Figure("comm_bytes_per_step", "bytes", better="lower", exact=True,
           views=("console", "arm", "cell", "effect", "gate")),
    Figure("comm_calls_per_step", "count", "calls/step", "lower", exact=True,
           views=("console", "cell", "effect", "gate")),
    Figure("flops_per_token", "flops", "FLOP/token", exact=True, views=("gate",)),
    Figure("nonfinite_steps", "count", "steps", "lower", views=("console", "arm")),
    Figure("scaler_skipped_steps", "count", "steps", "lower", views=("console", "arm")),
    Figure("loss_scale", "plain"),
    Figure("grad_norm", "plain"),
    # shown by no view of their own; declared so that a search can aim at them (ablate.tune --objective)
    Figure("step_time_p90_s", "time", "s", "lower"),
    Figure("step_time_mean_s", "time", "s", "lower"),
    Figure("tokens_per_s_wall", "rate", "tok/s", "higher"),
    Figure("stall_s", "time", "s", "lower"),
    Figure("compute_before_comm_s", "time", "s", "lower"),
    Figure("activation_bytes", "bytes", better="lower"),
    Figure("peak_bytes_measured", "bytes", better="lower", views=("console", "arm")),
    Figure("peak_bytes_planned", "bytes", better="lower", views=("arm",)),
    Figure("peak_ratio", "plain", views=("arm",)),   # measured / planned (model/peak.py)
    Figure("hw_flops_per_token", "flops", "FLOP/token"),
    # a pipeline's (parallel.pp > 1): the fraction of a step its ranks wait, measured and as its schedule expects
    Figure("pp_bubble", "share", "%", "lower", "linear", views=("console", "arm")),
    Figure("pp_bubble_expected", "share", "%", "lower", "linear", views=("arm",)),
)


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
