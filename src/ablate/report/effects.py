"""Main effects and interactions of a factorial sweep (sweeps/ files with `design: factorial`), with
95% intervals from a linear model fitted by statsmodels.

Each factor of two levels is coded -1 (its first level, the reference) / +1. Rates, bytes and times are
modelled on the log scale, so a main effect is a ratio: level 2 over level 1, averaged over the other
factors (exp(2b)); a 2-way interaction is a ratio of ratios (how much factor A's ratio changes when B
moves to its second level: exp(4b)); a 3-way one, the change of that across the third (exp(8b)).
Shares (data wait, MFU) are modelled on their value: a difference, a difference of differences.
Terms: every main effect, every 2-way interaction and, in a full 2^3, the 3-way one; a fraction of
resolution below V gives main effects only (its 2-way interactions are aliased). A term whose every
repeat agrees exactly (bytes, calls) is `exact`. D/effects.csv columns: metric, term, estimate, ci_low,
ci_high, n, kind, exact; `term` is a factor's knob as the sweep file writes it, interactions joined by ':'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from ablate import design, units
from ablate.report import runs as R
from ablate.report import stats, table
from ablate.report.adhoc import adhoc_grid

RESPONSES = units.in_view("effect")   # the registry of figures (units.py): which, their scale, which are exact
KINDS = {(True, 1): "ratio", (True, 2): "ratio of ratios", (True, 3): "ratio of ratios of ratios",
         (False, 1): "difference", (False, 2): "difference of differences", (False, 3): "3-way difference"}
FIELDS = ("metric", "term", "estimate", "ci_low", "ci_high", "n", "kind", "exact", "p_holm")


@dataclass
class Effect:
    metric: str
    term: str
    estimate: float
    ci_low: Optional[float]
    ci_high: Optional[float]
    n: int
    kind: str
    exact: bool
    p_holm: Optional[float] = None   # p of "no effect", Holm-corrected over this metric's terms


@dataclass
class Factorial:
    name: str
    sweep: Dict
    runs: List[R.Run]
    effects: List[Effect]
    notes: List[str]


def coded(runs: List[R.Run], factors: Dict[str, list]) -> np.ndarray:
    """-1/+1 per run and factor (first level -1)."""
    text = {k: [str(v).lower() for v in levels] for k, levels in factors.items()}
    return np.array([[1.0 if str(r.level(k)).lower() == text[k][1] else -1.0 for k in factors] for r in runs])


def terms(k: int, full: bool, resolution: Optional[int]) -> List[tuple]:
    """Column index tuples of the model's terms."""
    out = [(i,) for i in range(k)]
    if resolution is None or resolution >= 5:
        out += list(combinations(range(k), 2))
    if full and k == 3:
        out.append((0, 1, 2))
    return out


def fit(metric: str, y: List[float], x: np.ndarray, knobs: List[str], model_terms: List[tuple]) -> List[Effect]:
    import statsmodels.api as sm

    log_scale = units.on_log_scale(metric)
    values = np.log(y) if log_scale else np.array(y)
    design = np.column_stack([np.ones(len(y))] + [np.prod(x[:, list(t)], axis=1) for t in model_terms])
    result = sm.OLS(values, design).fit()
    zero_residuals = bool(np.allclose(result.resid, 0, atol=1e-9 * max(1.0, float(np.abs(values).max()))))
    # a count the same in every repeat by construction (the collectives a configuration issues) is exact even
    # with one run per cell, where a saturated model's zero residuals prove nothing
    exact = zero_residuals and (result.df_resid > 0 or units.is_exact(metric))
    ci = result.conf_int(0.05) if result.df_resid > 0 else None
    p_holm = holm(list(result.pvalues[1:])) if ci is not None and not exact else [None] * len(model_terms)
    out = []
    for j, t in enumerate(model_terms, start=1):
        def to_effect(b: float, scale: int = 2 ** len(t)) -> float:
            return math.exp(scale * b) if log_scale else scale * b

        lo, hi = (to_effect(ci[j][0]), to_effect(ci[j][1])) if ci is not None else (None, None)
        estimate = to_effect(result.params[j])
        if exact:   # every run agrees: the estimate is exact, up to the float noise of log and exp
            estimate = float(f"{estimate:.12g}")
            lo = hi = estimate
        out.append(Effect(metric, ":".join(knobs[i] for i in t), estimate, lo, hi, len(y),
                          KINDS[(log_scale, len(t))], exact, p_holm[j - 1]))
    return out


def holm(p_values: List[float]) -> List[Optional[float]]:
    """Holm's step-down correction over the terms of one metric (Holm 1979): sorted ascending, the i-th of m
    is multiplied by m - i, then made monotone and capped at 1. Written out: statsmodels' multipletests
    gives the same numbers but runs a full garbage collection on each call (~85 ms in a process holding torch)."""
    if any(p is None or p != p for p in p_values):
        return [None] * len(p_values)
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def conclusion(a: Factorial, metric: str = "tokens_per_s") -> List[str]:
    """A factorial's plain-language summary: the largest effects with intervals, and whether any interaction
    is distinguishable from noise at 5% after Holm's correction over the terms."""
    shown = [e for e in a.effects if e.metric == metric]
    if not shown:
        return [f"No effects on {metric} could be estimated here (see the notes)."]
    size = (lambda e: abs(math.log(e.estimate))) if shown[0].kind.startswith("ratio") else (lambda e: abs(e.estimate))
    mains = sorted((e for e in shown if ":" not in e.term), key=size, reverse=True)
    inter = [e for e in shown if ":" in e.term]
    said = "; ".join(f"`{e.term}` {effect_text(e)}" for e in mains[:3])
    lines = [f"**In short** ({metric}): the largest main effects: {said}."]
    if any(e.p_holm is None for e in shown):
        lines.append("Which terms stand out from noise cannot be said without repeats (no intervals).")
        return lines
    real = [e for e in mains if e.p_holm < 0.05]
    lines.append(f"{len(real)} of {len(mains)} main effects differ from no change at 5% after Holm's correction "
                 f"over the {len(shown)} terms" + (f" ({', '.join(f'`{e.term}`' for e in real)})." if real else "."))
    if inter:
        seen = [e for e in inter if e.p_holm < 0.05]
        lines.append("Interactions distinguishable from noise: " + (", ".join(
            f"`{e.term}` {effect_text(e)} (Holm p = {e.p_holm:.2g})" for e in seen) if seen else
            f"none (smallest Holm p = {min(e.p_holm for e in inter):.2g})") + ".")
    return lines


def analyse(name: str, sweep: Dict, runs: List[R.Run]) -> Factorial:
    factors = {k: list(v) for k, v in sweep["factors"].items()}
    knobs, notes, effects = list(factors), [], []
    if any(len(v) != 2 for v in factors.values()):
        notes.append("effects are estimated for two-level factors only: this grid's runs are listed, not analysed")
        return Factorial(name, sweep, runs, [], notes)
    resolution = design.resolution(sweep["fraction"].split()) if sweep.get("fraction") else None
    if resolution is not None and resolution < 5:
        notes.append(f"a resolution-{resolution} fraction: 2-way interactions are aliased, main effects only")
    x = coded(runs, factors)
    reference = [r for r, row in zip(runs, x) if (row < 0).all()]
    R.common_peak(runs, reference)
    model_terms = terms(len(knobs), sweep.get("fraction") is None, resolution)
    for metric in sweep.get("responses") or RESPONSES:
        y = [r.metric(metric) for r in runs]
        invalid = [(r.path.name, r.invalid(metric)) for r in runs if r.invalid(metric)]
        if invalid:
            notes.append(f"{metric}: left out, invalid in {len(invalid)} run(s) ({invalid[0][0]}: {invalid[0][1]})")
            continue
        if any(v is None for v in y):
            notes.append(f"{metric}: not recorded by every run (e.g. not measurable here)")
            continue
        if units.on_log_scale(metric) and min(y) <= 0:
            notes.append(f"{metric}: zero in some runs, so no ratio")
            continue
        if len(y) < len(model_terms) + 1:
            notes.append(f"{metric}: {len(y)} runs for {len(model_terms) + 1} model terms: use --repeats 2 or more")
            continue
        effects += fit(metric, y, x, knobs, model_terms)
    if len(runs) == len(model_terms) + 1:
        notes.append("one run per cell: each effect is a point estimate without an interval (repeats give "
                     "intervals: `+sweep.repeat=0,1` on a -m grid, or --repeats with ablate.sweeps)")
    return Factorial(name, sweep, runs, effects, notes)


def find(runs: List[R.Run]) -> List[Factorial]:
    """The factorial sweeps among these runs, and an ad-hoc `-m` grid (adhoc.adhoc_grid) as one more."""
    by_name = R.by_design(runs, "factorial")
    found = [analyse(name, by_name[name][0].sweep, by_name[name]) for name in sorted(by_name)]
    grid = adhoc_grid(runs)
    if grid:
        factors, grid_runs = grid
        found.append(analyse("grid", {"name": "grid", "claim": "—", "design": "factorial", "factors": factors,
                                      "technique": f"ad-hoc grid over {', '.join(factors)}"}, grid_runs))
    return found


def write_csv(path: Path, analyses: List[Factorial]) -> None:
    table.write(path, FIELDS, (e for a in analyses for e in a.effects))


def console(a: Factorial) -> List[str]:
    """The console's lines: the effects on tokens/s (every metric's are in effects.csv)."""
    return [f"{a.name}: effects on tokens/s (level 2 over level 1; interactions as ratios of ratios):"] + \
        [f"  {e.term:<32} {effect_text(e)}" for e in a.effects if e.metric == "tokens_per_s"]


def wandb_section(a: Factorial):
    """Its W&B workspace section: each factor's levels to the speed, run by run (wandb-workspaces)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    def config_key(knob: str) -> str:   # a config group's `name`, else the knob itself
        return f"{knob}.name" if isinstance(a.runs[0].config.get(knob), dict) else knob

    columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(config_key(k))) for k in a.sweep["factors"]]
    panels = [wr.ParallelCoordinatesPlot(title="factors -> tokens/s", columns=columns + [
        wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric("tokens_per_s"))])]
    panels += [wr.LinePlot(title=f"{m} against step", x="step", y=[m]) for m in ("tokens_per_s", "loss")]
    return ws.Section(name=f"{a.sweep.get('technique', '')} ({a.name}, factorial)", panels=panels, is_open=True,
                      panel_settings=ws.SectionPanelSettings(x_axis="step"))


def effect_text(e: Effect) -> str:
    log_scale = e.kind.startswith("ratio")
    show = (lambda v: f"x{v:.3g}") if log_scale else (lambda v: units.effect("difference", v, e.metric))
    if e.exact:
        return f"{show(e.estimate)} (exact)"
    if e.ci_low is None:
        return f"{show(e.estimate)} (no interval: as many runs as model terms)"
    return f"{show(e.estimate)} [{show(e.ci_low)}, {show(e.ci_high)}]"


def section(a: Factorial, plot: Optional[str]) -> List[str]:
    s = a.sweep
    grid = (f"Fraction `{s['fraction']}`, resolution {design.resolution(s['fraction'].split())}"
            if s.get("fraction") else "Full grid")
    lines = ["", f"## {R.title(s, a.name)} (`{a.name}`, factorial)", "",
             *conclusion(a), "",
             "Factors: " + "; ".join(f"`{k}`: {' → '.join(map(str, v))}" for k, v in s["factors"].items())
             + f". {len(a.runs)} runs. {grid}.",
             "", "Effects (95% interval over a linear model; ratios are level 2 over level 1, averaged over the "
             "other factors; an interaction is a ratio of ratios):", "",
             "| metric | term | effect [95% CI] | kind | n |", "|---|---|---|---|---|"]
    lines += [f"| {e.metric} | `{e.term}` | {effect_text(e)} | {e.kind} | {e.n} |" for e in a.effects]
    lines += [""] + [f"- {n}" for n in a.notes] + cells_table(a)
    return lines + (["", f"![{a.name}]({plot})"] if plot else [])


CELL_FIGURES = units.in_view("cell")


def cells_table(a: Factorial) -> List[str]:
    """Every cell of the grid with its runs' central figures: what each combination measured, at any n."""
    knobs = list(a.sweep["factors"])
    cells: Dict[tuple, List[R.Run]] = {}
    for run in a.runs:
        cells.setdefault(tuple(str(run.level(k)) for k in knobs), []).append(run)
    lines = ["", "Each cell (the central value of its runs):", "",
             "| " + " | ".join(f"`{k}`" for k in knobs) + " | n | " + " | ".join(CELL_FIGURES) + " |",
             "|---" * (len(knobs) + 1 + len(CELL_FIGURES)) + "|"]
    for levels, runs in sorted(cells.items()):
        values = [stats.central(r.metric(m) for r in runs) for m in CELL_FIGURES]
        shown = [units.fmt(m, v) if v is not None else "—" for m, v in zip(CELL_FIGURES, values)]
        lines.append("| " + " | ".join(levels) + f" | {len(runs)} | " + " | ".join(shown) + " |")
    return lines


def draw(out: Path, a: Factorial, metric: str = "tokens_per_s") -> Optional[str]:
    """Every term's effect on `metric` with its 95% interval, on ONE shared axis (log scale for ratios: x0.5 and
    x2 are as far from no change), so a small effect with a wide interval never looks as steep as a large one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [e for e in a.effects if e.metric == metric]
    if not shown:
        return None
    ratio = shown[0].kind.startswith("ratio")
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(shown) + 1.4))
    ys = list(range(len(shown)))[::-1]
    for y, e in zip(ys, shown):
        colour = "#2a7ab0" if len(e.term.split(":")) == 1 else "#7f5fb0"
        if e.ci_low is not None and e.ci_high is not None and e.ci_high > e.ci_low:
            ax.errorbar([e.estimate], [y], xerr=[[e.estimate - e.ci_low], [e.ci_high - e.estimate]], fmt="o",
                        color=colour, capsize=3)
        else:   # a point estimate (one run per cell) or an exact one: no interval drawn
            ax.plot([e.estimate], [y], "o" if e.exact else "D", color=colour)
        ax.annotate(effect_text(e), (e.estimate, y), textcoords="offset points", xytext=(0, 6), ha="center",
                    fontsize=6.5)
    ax.axvline(1.0 if ratio else 0.0, color="#555555", linewidth=0.8)
    if ratio:
        ax.set_xscale("log")
    ax.set_yticks(ys, [e.term.replace(":", " x ") for e in shown], fontsize=7)
    ax.margins(y=0.25)
    ax.set_xlabel(f"effect on {metric} ({'ratio, log scale' if ratio else 'difference'}); "
                  "purple: interactions", fontsize=8)
    ax.set_title(f"{a.name}: effects on {metric} with 95% intervals", fontsize=9)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    name = f"{a.name}.effects.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name
