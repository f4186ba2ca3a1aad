"""The week-4 stack as a waterfall (sweeps/ files with `design: stack`, design.stack names the arms).

Each arm's level of each metric (median over repeats, with a 95% interval of its level: log scale for
rates and bytes, logit for shares) and its change against its reference, paired by repeat: a cumulative
step against the step before it, the memory step and every leave-one-out arm against the full stack (a
leave-one-out change below x1 on tokens/s means the step left out was helping). Changes are ratios for
rates and bytes, differences for shares, with stats.estimate's interval. MFU is `mfu_common_peak`:
every arm over the baseline's peak, so a bf16 step shows as the speed it is. D/waterfall.csv columns:
kind, step, arm, metric, value, ci_low, ci_high, change, change_ci_low, change_ci_high, n.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from ablate import design, units
from ablate.report import runs as R
from ablate.report import stats, table

FIELDS = ("kind", "step", "arm", "metric", "value", "ci_low", "ci_high", "change", "change_ci_low",
          "change_ci_high", "n")
PLOTTED = ("tokens_per_s", "mfu_common_peak")


@dataclass
class Row:
    kind: str
    step: str
    arm: str
    metric: str
    value: Optional[float]
    ci_low: Optional[float]
    ci_high: Optional[float]
    change: Optional[float]
    change_ci_low: Optional[float]
    change_ci_high: Optional[float]
    n: int


@dataclass
class Stack:
    name: str
    sweep: Dict
    arms: List[design.Arm]
    runs: Dict[str, List[R.Run]]     # arm label -> its runs, in repeat order
    rows: List[Row]


def _reference(arms: List[design.Arm], i: int) -> Optional[design.Arm]:
    arm = arms[i]
    cumulative = [a for a in arms if a.kind == "cumulative"]
    if arm.kind == "cumulative":
        j = cumulative.index(arm)
        return cumulative[j - 1] if j else None
    return cumulative[-1]      # memory step and leave-one-out arms: against the full stack


def rows_for(arms: List[design.Arm], by_arm: Dict[str, List[R.Run]], metric: str) -> List[Row]:
    out = []
    share = not units.on_log_scale(metric)
    for i, arm in enumerate(arms):
        values = [r.metric(metric) for r in by_arm.get(arm.label, [])]
        values = [v for v in values if v is not None]
        if not values:
            continue
        lo, hi = stats.spread(values, share=share)
        ref = _reference(arms, i)
        est = None
        if ref is not None and by_arm.get(ref.label):
            before = [r.metric(metric) for r in by_arm[ref.label]]
            est = stats.estimate("difference" if share else "ratio", before,
                                 [r.metric(metric) for r in by_arm[arm.label]])
        out.append(Row(arm.kind, arm.step, arm.label, metric, statistics.median(values), lo, hi,
                       est.median if est else None, est.ci_low if est else None, est.ci_high if est else None,
                       len(values)))
    return out


def find(runs: List[R.Run]) -> List[Stack]:
    by_name = R.by_design(runs, "stack")
    stacks = []
    for name in sorted(by_name):
        node = by_name[name][0].sweep
        arms = design.stack(node)
        by_arm: Dict[str, List[R.Run]] = {}
        for run in sorted(by_name[name], key=lambda r: (r.repeat or 0, str(r.path))):
            by_arm.setdefault(run.knob("sweep.arm"), []).append(run)
        R.common_peak(by_name[name], by_arm.get("baseline", []))
        rows = [row for metric in node.get("metrics") or PLOTTED for row in rows_for(arms, by_arm, metric)]
        stacks.append(Stack(name, node, arms, by_arm, rows))
    return stacks


def write_csv(path: Path, stacks: List[Stack]) -> None:
    table.write(path, FIELDS, (row for s in stacks for row in s.rows))


def console(s: Stack) -> List[str]:
    """The console's lines: tokens/s step by step (every metric's are in waterfall.csv)."""
    return [f"{s.name}: tokens/s step by step (change against the step before, or the full stack):"] + \
        [f"  {row.kind:<14} {row.step:<12} {units.fmt(row.metric, row.value):>14}  {change_text(row)}"
         for row in s.rows if row.metric == "tokens_per_s"]


def change_text(row: Row) -> str:
    if row.change is None:
        return "—"
    kind = "ratio" if units.on_log_scale(row.metric) else "difference"
    text = units.effect(kind, row.change, row.metric)
    if row.change_ci_low is None:
        return f"{text} (n={row.n}: {'too small for an interval' if row.n > 1 else 'no interval'})"
    ends = [units.effect(kind, v, row.metric) for v in (row.change_ci_low, row.change_ci_high)]
    return f"{text} [{ends[0]}, {ends[1]}]"


def section(s: Stack, plot: Optional[str]) -> List[str]:
    lines = ["", f"## {R.title(s.sweep, s.name)} (`{s.name}`, waterfall)", "",
             f"{s.sweep.get('claimed_text', '')}. Cumulative steps change against the step before; the memory "
             "step and each leave-one-out arm against the full stack (below x1 on tokens/s: the step left out "
             "was helping).", "", "| kind | step | metric | value [95% CI] (n) | change [95% CI] |",
             "|---|---|---|---|---|"]
    for row in s.rows:
        value = f"{units.fmt(row.metric, row.value)}" + (
            f" [{units.fmt(row.metric, row.ci_low)}, {units.fmt(row.metric, row.ci_high)}]" if row.ci_low is not None
            else "") + f" (n={row.n})"
        lines.append(f"| {row.kind} | {row.step} | {row.metric} | {value} | {change_text(row)} |")
    return lines + (["", f"![{s.name}]({plot})"] if plot else [])


def draw(out: Path, s: Stack) -> Optional[str]:
    """Waterfalls of tokens/s and MFU (one peak) over the cumulative steps, and the leave-one-out changes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, metric in zip(axes, PLOTTED):
        rows = [r for r in s.rows if r.metric == metric and r.kind == "cumulative"]
        if not rows:
            ax.axis("off")
            continue
        label, div = units.unit(metric, rows[0].value or 1)
        highest = max(max(r.value, r.ci_high if r.ci_high is not None else r.value) for r in rows)
        ax.set_ylim(0, highest / div * 1.12)   # every bar and interval inside the axes
        previous = 0.0
        for x, row in enumerate(rows):
            bottom, top = (0.0, row.value) if x == 0 else (previous, row.value)
            colour = "#999999" if x == 0 else "#2a7ab0" if top >= bottom else "#c0392b"
            ax.bar(x, (top - bottom) / div, bottom=bottom / div, color=colour)
            if row.ci_low is not None:
                bars = [[(row.value - row.ci_low) / div], [(row.ci_high - row.value) / div]]
                ax.errorbar(x, row.value / div, yerr=bars, color="black", capsize=3)
            previous = row.value
        ax.set_xticks(range(len(rows)), [r.step if x == 0 else f"+{r.step}" for x, r in enumerate(rows)],
                      rotation=20, fontsize=7)
        ax.set_title(f"{metric} ({label})" if label else metric, fontsize=8)
    loo = [r for r in s.rows if r.metric == "tokens_per_s" and r.kind == "leave_one_out" and r.change is not None]
    axes[2].bar(range(len(loo)), [r.change for r in loo], color="#7fb27f")
    for x, r in enumerate(loo):
        if r.change_ci_low is not None:
            axes[2].errorbar(x, r.change, yerr=[[r.change - r.change_ci_low], [r.change_ci_high - r.change]],
                             color="black", capsize=3)
    axes[2].axhline(1.0, color="#555555", linewidth=0.8)
    axes[2].set_xticks(range(len(loo)), [f"-{r.step}" for r in loo], rotation=20, fontsize=7)
    axes[2].set_title("tokens/s of the full stack minus one step (x of full)", fontsize=8)
    fig.suptitle(f"{s.name}: the stack step by step (measured)", fontsize=9)
    fig.tight_layout()
    name = f"{s.name}.waterfall.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name
