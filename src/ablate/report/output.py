"""What `ablate.report` shows: report.md (header, verdict table, one section per comparison), one PNG
per comparison with its data beside it as JSON, and the console table."""
from __future__ import annotations

from pathlib import Path
from typing import List

from ablate import units
from ablate.report import noise, outliers, panels, sequential, stats, timeline
from ablate.report import runs as R
from ablate.report.analyses import ANALYSES, GROUP_SECTIONS
from ablate.report.compare import Check, Report
from ablate.report.stats import VERDICTS

THRESHOLD_RULE = ("Verdicts: the effect is the median over paired repeats, with a 95% t-interval (on log-ratios "
                  "for ratios and reductions). *reproduced*: the whole interval lies on the claimed side of the "
                  "threshold (target − tolerance for higher-is-better, + tolerance for lower-is-better, ± for "
                  "equal); *not reproduced*: wholly on the other side; *inconclusive*: it straddles, or n = 1; "
                  "*not measurable here*: the figure does not exist on this hardware; *no claim*: an effect "
                  "without a claim (A/A noise, ad-hoc comparisons). The target is the value expected here when "
                  "ablate can compute one for these runs, else the article's claim. Exact figures need no interval.")


def measured_text(c) -> str:
    return stats.effect_text(c.effect_kind, c.metric, c.measured, c.ci_low, c.ci_high, c.n, c.exact)


def claimed_text(c) -> str:
    return "no claim" if c.claimed is None else units.effect(c.effect_kind, c.claimed, c.metric)


def header(report: Report) -> List[str]:
    lines = ["# ablate report: claimed vs measured", "", noise.header_line(report.noise_floor)]
    if report.sequential:
        lines += ["", sequential.header_line(report.sequential)]
    hardware = sorted({r.hardware for r in report.runs})
    lines += ["", f"Hardware: {'; '.join(hardware)}. {len(report.runs)} runs.", "", peaks_line(report.runs),
              "", THRESHOLD_RULE, "", outliers.RULE, ""]
    groups = sorted({(r.summary.get("wandb") or {}).get("group") for r in report.runs} - {None})
    if groups:
        lines += [f"W&B: group(s) {', '.join(f'`{g}`' for g in groups)} (in the project, *Group* by that name; "
                  "tags `arm:baseline|treatment`, `repeat:N` filter the arms and repeats)", ""]
    if report.unfinished:
        lines += ["**Runs that did not finish** (no summary.json; not in any figure):", ""]
        lines += [f"- `{p}`" for p in report.unfinished] + [""]
    if report.missing:
        lines += [f"**Runs of the sweep's plan without a result** ({len(report.missing)}; the same ablate.sweeps "
                  "command runs them):", ""]
        lines += [f"- {m}" for m in report.missing] + [""]
    named = outliers.lines(report.groups, report.outliers)
    if named:
        lines += ["**Outliers and stalls** (each check touched by an outlier gives its estimate the other way "
                  "too, in *other way*):", ""] + named + [""]
    return lines


def peaks_line(runs) -> str:
    """Which peak FLOP/s the runs' MFU divides by, and when it was measured: one per host and dtype, shared
    by every run and sweep there (metrics/peak.py), so MFU compares across sweeps."""
    seen = {}
    for r in runs:
        s = r.summary
        if s.get("peak_flops"):
            probe = s.get("peak_flops_probe") or {}
            when = f", measured {probe['measured_at']}" if s.get("peak_flops_source") == "measured" and probe else ""
            label = f"{s['peak_flops'] / 1e12:.4g} TFLOP/s ({s.get('peak_flops_source')}{when})"
            seen[label] = seen.get(label, 0) + 1
    if not seen:
        return "Peak FLOP/s: none recorded (no MFU)."
    return "Peak FLOP/s (MFU's denominator): " + "; ".join(f"{k} in {n} run(s)" for k, n in seen.items()) + "."


def against_expected(c) -> bool:
    """A verdict judged against the value expected here, not against the claim itself."""
    return c.claimed is not None and c.expected_here is not None and c.expected_here != c.claimed \
        and c.verdict in ("reproduced", "not reproduced", "inconclusive")


def verdict_table(checks) -> List[str]:
    other = any(c.other_way for c in checks)
    lines = ["| claim | arm | check | claimed | expected here | measured [95% CI] (n) | verdict | hardware | layout | "
             "reason |" + (" other way |" if other else ""), "|---" * (11 if other else 10) + "|"]
    for c in checks:
        expected = units.effect(c.effect_kind, c.expected_here, c.metric) if c.expected_here is not None else "—"
        judged = f"**{c.verdict}**" + (" (vs expected here)" if against_expected(c) else "")
        lines.append(f"| {c.claim} | `{c.treatment}` vs `{c.baseline}` | {c.metric}: {c.what} | {claimed_text(c)} | "
                     f"{expected} | {measured_text(c)} | "
                     f"{judged} | {c.hardware} | {c.layout} | {c.reason} |"
                     + (f" {c.other_way or '—'} |" if other else ""))
    return lines


ARM_COLUMNS = units.in_view("arm")   # the registry of figures (units.py)


def stragglers(runs) -> str:
    """'rank 1 x3.1 in 2/2 runs' (the report's straggler column), '—' when no run had one."""
    found = [r.summary["straggler"] for r in runs if r.summary.get("straggler")]
    if not found:
        return "—"
    ranks = sorted({f"rank {s['rank']} ({s['host']})" for s in found})
    worst = max(s["slowdown"] for s in found)
    return f"{', '.join(ranks)} up to x{worst:.2f} in {len(found)}/{len(runs)} runs"


def common_peak_text(group) -> str:
    run = next((r for arm in group.arms.values() for r in arm.runs if r.derived.get("common_peak_flops")), None)
    if run is None:
        return "mfu_common_peak: no peak recorded for the baseline."
    return (f"`mfu` divides each arm by its own precision's peak; `mfu_common_peak` divides every arm by one "
            f"peak, the baseline's ({run.derived['common_peak_flops'] / 1e12:.3g} TFLOP/s), so arms compare as speeds.")


def timelines(out: Path, group) -> List[str]:
    """One profiled step per rank of each arm's first traced run: compute / comm / data-wait lanes."""
    written = []
    for role, arm in group.arms.items():
        run = next((r for r in arm.runs if (r.path / "traces").is_dir()), None)
        for trace in sorted(run.path.glob("traces/rank*.json.gz")) if run else []:
            rank = trace.name.split(".")[0]
            name = f"{group.name}_{role}_{rank}.timeline.png"
            start = (run.knob("metrics.profile_steps") or [None])[0]
            repeat = f", repeat {run.repeat}" if run.repeat is not None else ""
            if timeline.draw(trace, out / name, f"{group.name}: {role} `{arm.value}`{repeat}, {rank}", start):
                written.append(name)
    return written


def group_section(group, plot: str, pictures: List[str] = ()) -> List[str]:
    s = group.sweep
    claimed = f"Claimed: {s['claimed_text']}." if s.get("claimed_text") else \
        "No claim: each effect is measured, with its interval, and compared with nothing."
    lines = ["", f"## {R.title(s, group.name)} (`{group.name}`)", "",
             f"{claimed} Knob: `{s['knob']}`.", "", noise.within_text(noise.within(group)),
             "", common_peak_text(group), "",
             "| arm | " + " | ".join(ARM_COLUMNS) + " | straggler |", "|---" * (len(ARM_COLUMNS) + 2) + "|"]
    for role, arm in group.arms.items():
        cells = []
        for key in ARM_COLUMNS:
            value = stats.central(arm.values(key))
            cells.append(units.fmt(key, value) if value is not None else "—")
        cells.append(stragglers(arm.runs))
        lines.append(f"| {role} (`{arm.value}`, n={len(arm.runs)}) | " + " | ".join(cells) + " |")
    for section in GROUP_SECTIONS:
        lines += section(group)
    if group.unpaired:
        lines += ["", "Unpaired repeats (one arm has more runs; drawn, not in the effect): "
                  + ", ".join(f"`{r.path.name}`" for r in group.unpaired)]
    lines += ["", f"![{group.name}]({plot})"]
    if pictures:
        lines += ["", "Timelines of one traced step (red: communication nothing else ran during; open "
                  "`traces/rank*.json.gz` of the run in https://ui.perfetto.dev for the whole trace):", ""]
        lines += [f"![{p}]({p})" for p in pictures]
    return lines


def write(out: Path, report: Report) -> Path:
    lines = header(report) + verdict_table(report.checks)
    for group in report.groups:
        plot = panels.draw(out, group, [c for c in report.checks if c.sweep == group.name], measured_text)
        lines += group_section(group, plot, timelines(out, group))
    for analysis in ANALYSES:
        for item in report.found[analysis.key]:
            lines += analysis.section(item, analysis.draw(out, item))
    if report.arithmetic:   # the week-4 claims' own numbers: for their sweeps, not a sweep of the user's
        lines += ["", "## The claims' arithmetic", ""] + [f"- {a}" for a in report.arithmetic]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def arms_text(c: Check) -> str:
    """Which arms a check compares, treatment first: `key=new vs old` when both set one key."""
    (tk, _, tv), (bk, _, bv) = c.treatment.partition("="), c.baseline.partition("=")
    return f"{tk}={tv} vs {bv}" if tk == bk and tv and bv and "," not in tk else f"{c.treatment} vs {c.baseline}"


def print_table(report: Report) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    floor = report.noise_floor
    table = Table(title="claimed vs measured" + (f" (noise floor ±{floor['half_width']:.1%} tok/s, n={floor['n']})"
                                                 if floor and "half_width" in floor else ""))
    claimed = any(c.claimed is not None for c in report.checks)   # (a column of "no claim" only: left out)
    for col in ("claim", "arms", "check", *(("claimed",) if claimed else ()), "measured [95% CI] (n)", "verdict"):
        table.add_column(col, overflow="fold" if col == "arms" else "ellipsis")
    colour = dict(zip(VERDICTS, ("green", "red", "yellow", "bright_black", "cyan", "bold red")))
    for c in report.checks:
        vs = " (vs expected here)" if against_expected(c) else ""
        table.add_row(c.claim, escape(arms_text(c)), c.metric, *((claimed_text(c),) if claimed else ()),
                      escape(measured_text(c)), f"[{colour[c.verdict]}]{c.verdict}{vs}")
    if report.checks:
        Console().print(table)
    for analysis in ANALYSES:
        for item in report.found[analysis.key]:
            print("\n".join(analysis.console(item)))
    for c in report.checks:
        if c.verdict in ("not measurable here", "failed"):
            print(f"  {c.claim} {c.metric}: {c.verdict}: {c.reason}")
    for p in report.unfinished:
        print(f"  did not finish: {p}")
    for m in report.missing:
        print(f"  no result yet: {m}")
