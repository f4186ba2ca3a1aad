"""What a tune leaves in its --dir: D/tune.csv (a row a trial), D/best.yaml (the winner's overrides), D/report.md,
D/tune.png (objective against peak memory, the budget line, the Pareto front) and, when the trials were logged to
W&B, D/wandb_workspace.json."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Dict, List, Optional

import yaml

from ablate import units
from ablate.config import record
from ablate.report import wandb_view
from ablate.tune import Trial, best_two, direction, pareto, parse_space


def write(args, trials: List[Trial], base: List[str], budget: Optional[float], confirmed) -> None:
    d, maximise = args.dir, direction(args.objective) == "maximize"
    with (d / "tune.csv").open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["trial", "overrides", "state", "objective", "mem_peak_bytes", "reason", "seconds"])
        for t in distinct(trials):
            out.writerow([t.number, " ".join(t.overrides[len(base):]), t.state, t.objective, t.mem_peak_bytes,
                          t.reason, t.seconds])
    winner, runner = best_two(trials, maximise)
    if confirmed and runner is not None and confirmed.get("best") == runner.number:   # the confirmation's word
        winner, runner = runner, winner
    if winner:
        chosen = [o for o in winner.overrides if not o.startswith("logger.group=")]   # (the tune's own W&B group)
        (d / "best.yaml").write_text("\n".join(chosen) + "\n")
    front = pareto(trials, maximise)
    plot = draw(d, trials, front, budget, args.objective)
    points = distinct(trials)
    counts = {s: sum(t.state == s for t in points) for s in ("complete", "pruned", "failed", "oom")}
    lines = [f"# ablate tune: {args.objective} ({direction(args.objective)})", "",
             f"{len(points)} trials: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
             + f"; {sum(t.seconds for t in trials):.0f} s of runs." + (f" Budget {budget / 1e9:g} GB per rank."
                                                                      if budget else ""), ""]
    if winner:
        lines += [f"**Best**: trial {winner.number}, `{' '.join(winner.overrides[len(base):])}`: "
                  f"{units.fmt(args.objective, winner.objective)} (`python -m ablate $(cat {d / 'best.yaml'})`)."]
    if confirmed:
        lines += ["", f"**Confirmed** ({args.confirm} more runs each): {confirmed['text']}"]
    lines += ["", "| trial | overrides | state | objective | peak memory | reason |", "|---|---|---|---|---|---|"]
    lines += [f"| {t.number} | `{' '.join(t.overrides[len(base):])}` | {t.state} | "
              f"{units.fmt(args.objective, t.objective) if t.objective is not None else '—'} | "
              f"{units.fmt('bytes', t.mem_peak_bytes) if t.mem_peak_bytes else '—'} | {t.reason} |"
              for t in distinct(trials)]
    lines += ["", f"Pareto front (no trial is better on both): {', '.join(str(t.number) for t in front) or '—'}."]
    lines += (["", f"![tune]({plot})"] if plot else [])
    spec = write_workspace(d, trials, list(parse_space(args.space)), args.objective)
    lines += (["", f"W&B: the trials' workspace (a parallel-coordinates panel) in `{spec}`."] if spec else [])
    (d / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6]))
    print(f"report: {d / 'report.md'} (and tune.csv, best.yaml{', ' + plot if plot else ''})")


def distinct(trials: List[Trial]) -> List[Trial]:
    """One row per point measured: its last attempt that was not a re-ask (a point the sampler asked for again
    reuses its figures; a failed attempt a later call ran again is replaced by that run)."""
    rows: Dict[str, Trial] = {}
    for t in trials:
        key = " ".join(t.overrides)
        if key not in rows or (t.seconds and rows[key].state != "complete"):
            rows[key] = t
    return sorted(rows.values(), key=lambda t: t.number)


def write_workspace(d: Path, trials: List[Trial], knobs: List[str], objective: str) -> Optional[Path]:
    """D/wandb_workspace.json when the trials were logged to W&B (their summary names a group)."""
    where: Dict[str, object] = {"groups": []}
    for t in trials:
        path = record.path_of(Path(t.run_dir or "/nonexistent"))
        summary = record.load(path.parent) if t.state == "complete" and path.is_file() else {}
        group = (summary.get("wandb") or {}).get("group")
        if group and group not in where["groups"]:
            logger = (yaml.safe_load((path.parent / "config.yaml").read_text()) or {}).get("logger") or {}
            where.update(project=logger.get("project"), entity=logger.get("entity"))
            where["groups"].append(group)
    if not where["groups"]:
        return None
    (d / wandb_view.SPEC_FILE).write_text(json.dumps(wandb_view.tune_spec(knobs, objective, where), indent=1))
    return d / wandb_view.SPEC_FILE


def draw(d: Path, trials: List[Trial], front: List[Trial], budget: Optional[float], objective: str) -> Optional[str]:
    done = [t for t in trials if t.state == "complete" and t.objective is not None and t.mem_peak_bytes]
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.scatter([t.mem_peak_bytes / 1e9 for t in done], [t.objective for t in done], color="#2a7ab0", label="trials")
    for t in done:
        ax.annotate(str(t.number), (t.mem_peak_bytes / 1e9, t.objective), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.plot([t.mem_peak_bytes / 1e9 for t in front], [t.objective for t in front], "--", color="#c0392b",
            label="Pareto front")
    if budget:
        ax.axvline(budget / 1e9, color="#555555", linestyle=":", label="budget")
    ax.set_xlabel("peak memory per rank (GB)", fontsize=8)
    ax.set_ylabel(objective, fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title(f"ablate tune: {objective} against peak memory", fontsize=9)
    fig.tight_layout()
    fig.savefig(d / "tune.png", dpi=110)
    plt.close(fig)
    return "tune.png"
