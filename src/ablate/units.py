"""One way to write a figure for people: by what the metric is (a share, bytes, a rate, FLOPs...),
with its unit and thousands separators, never an exponent. Console, report and plan all use it."""
from __future__ import annotations

from typing import Optional, Tuple

FRACTIONS = ("mfu", "hfu", "data_wait_frac", "fragmentation", "inactive_split_frac", "gpu_util",
             "mfu_vs_measured_peak", "mfu_vs_datasheet_peak", "comm_overlap_frac", "mfu_common_peak")
UNITS = {"tokens_per_s": "tok/s", "tokens_per_s_per_device": "tok/s", "step_time_s": "s",
         "tflops_per_device": "TFLOP/s", "loss": "", "loss_scale": "", "grad_norm": ""}
BYTE_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def is_fraction(metric: str) -> bool:
    return metric in FRACTIONS or metric.endswith("_frac")


def unit(metric: str, magnitude: float = 1e9) -> Tuple[str, float]:
    """(unit label, divisor) for this metric: the table first (a rate named `..._per_s` is not a time),
    then by the name's kind; bytes pick a decimal unit that fits `magnitude`."""
    if metric in UNITS:
        return UNITS[metric], 1.0
    if is_fraction(metric):
        return "%", 0.01
    if "bytes" in metric:
        return next(((u, s) for u, s in BYTE_UNITS if abs(magnitude) >= s), ("B", 1.0))
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
    return UNITS.get(metric, ""), 1.0


def number(value: float) -> str:
    """Plain digits with separators: 4 significant digits below 1000, whole numbers above."""
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
