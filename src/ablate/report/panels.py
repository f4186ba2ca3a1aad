"""A comparison's picture: one PNG per sweep, one panel per metric - every arm's median and 95% interval, the
claimed level as a line, a metric this machine cannot measure greyed with the reason - and its data as JSON
beside it (`<sweep>.plot.json`)."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Callable, Dict

from ablate import units
from ablate.report import stats
from ablate.report.runs import title


def panel_data(group, check, measured: str) -> Dict[str, object]:
    """One panel: every arm's median and 95% interval, the claimed level, or the reason it is greyed; `measured`:
    the check's effect as the report writes it."""
    arms = []
    for role, arm in group.arms.items():
        values = [v for v in arm.values(check.metric) if v is not None]
        lo, hi = stats.spread(values, share=units.is_fraction(check.metric))
        arms.append({"role": role, "label": f"{arm.value}", "median": stats.central(values), "ci_low": lo,
                     "ci_high": hi, "n": len(values)})
    target = check.expected_here if check.expected_here is not None else check.claimed
    base = check.baseline_value
    line = None
    if target is not None:   # the claim as a level of the treatment arm
        line = {"ratio": lambda: base * target if base else None, "reduction": lambda: base * (1 - target)
                if base else None, "difference": lambda: base + target if base is not None else None
                }.get(check.effect_kind, lambda: target)()
    greyed = check.verdict == "not measurable here"
    return {"metric": check.metric, "effect": check.effect_kind, "arms": arms, "claimed_line": line,
            "line_label": "expected here" if check.expected_here is not None else "claimed",
            "greyed": greyed, "reason": check.reason if greyed else "", "verdict": check.verdict,
            "measured": measured, "unit": units.unit(check.metric, base or 1e9)[0]}


PANELS_PER_ROW = 3   # wider figures squeeze the arms' labels into each other


def draw(out: Path, group, checks, describe: Callable) -> str:
    """One PNG per comparison, one panel per metric (a metric checked twice is drawn once); `describe(check)`: its
    measured effect as text (output.measured_text)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels, seen = [], set()
    for c in checks:
        if c.metric not in seen:
            seen.add(c.metric)
            panels.append(panel_data(group, c, describe(c)))
    cols = min(len(panels), PANELS_PER_ROW)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.9 * rows), squeeze=False)
    for ax, p in zip(axes.flat, panels):
        _draw_panel(ax, p)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{title(group.sweep, group.name)}  (knob: {group.sweep['knob']})", fontsize=9)
    fig.tight_layout()
    name = f"{group.name}.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    (out / f"{group.name}.plot.json").write_text(json.dumps({"panels": panels}, indent=1, default=str))
    return name


def _draw_panel(ax, p: Dict) -> None:
    label, div = units.unit(p["metric"], max((a["median"] or 0 for a in p["arms"]), default=1) or 1)
    ax.set_title(f"{p['metric']}\n{p['verdict']}: {p['measured']}", fontsize=7.5)
    if p["greyed"]:
        ax.set_facecolor("#eeeeee")
        ax.text(0.5, 0.5, "not measurable here:\n" + _wrap(p["reason"]), ha="center", va="center", fontsize=7,
                color="#555555", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    xs = range(len(p["arms"]))
    heights = [(a["median"] or 0) / div for a in p["arms"]]
    errs = [[max(0.0, ((a["median"] or 0) - (a["ci_low"] if a["ci_low"] is not None else a["median"] or 0)) / div)
             for a in p["arms"]],
            [max(0.0, ((a["ci_high"] if a["ci_high"] is not None else a["median"] or 0) - (a["median"] or 0)) / div)
             for a in p["arms"]]]
    colours = ["#999999" if a["role"] == "baseline" else "#2a7ab0" if a["role"] == "treatment" else "#7fb27f"
               for a in p["arms"]]
    ax.bar(list(xs), heights, color=colours)
    for x, a in zip(xs, p["arms"]):   # an interval's bar only where there is one: no caps of zero width
        if a["ci_low"] is not None and a["ci_high"] is not None and a["ci_high"] > a["ci_low"]:
            ax.errorbar([x], [(a["median"] or 0) / div], yerr=[[errs[0][x]], [errs[1][x]]], capsize=4,
                        color="#333333", linewidth=1)
    for x, h in zip(xs, heights):
        ax.annotate(f"{units.number(h)}", (x, h), ha="center", va="bottom", fontsize=7)
    top = max([h + e for h, e in zip(heights, errs[1])] + [(p["claimed_line"] or 0) / div], default=0)
    if top > 0:
        ax.set_ylim(0, top * 1.15)   # bars, intervals, their labels and the claimed line inside the axes
    if p["claimed_line"] is not None:
        ax.axhline(p["claimed_line"] / div, color="#c0392b", linestyle="--", linewidth=1, label=p["line_label"])
        ax.legend(fontsize=7, loc="lower right")
    many = len(p["arms"]) > 3   # long labels of many arms: slanted, so they do not overlap
    ax.set_xticks(list(xs), [f"{_wrap(a['label'], 24)}\n({a['role']}, n={a['n']})" for a in p["arms"]],
                  fontsize=6 if many else 7, rotation=30 if many else 0, ha="right" if many else "center")
    ax.set_ylabel(f"{p['metric']} ({label})" if label else p["metric"], fontsize=8)
    ax.tick_params(axis="y", labelsize=7)


def _wrap(text: str, width: int = 38) -> str:
    return "\n".join(textwrap.wrap(text, width)[:6])
