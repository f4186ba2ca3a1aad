"""The W&B side of a report: the workspace of a sweep built as code, and a `report` run with the verdicts.

- `D/wandb_workspace.json`: a W&B workspace (wandb-workspaces) per call: one section per claim, a bar
  panel per checked metric grouped by arm (mean with stderr error bars over repeats), tokens/s and loss
  against `step`, for a grid over several knobs a parallel-coordinates panel from the knobs to tokens/s;
  the run set filtered to the call's W&B group(s) and grouped by arm. Built offline;
  `python -m ablate.report D --wandb` saves it to the project and prints its URL (after `wandb sync`).
- A run of job_type `report` in the same group logs the verdict table (`verdicts`, a wandb.Table:
  claim, check, claimed, expected here, measured, interval, n, verdict) and the report's PNGs; offline
  when W&B is, its files under D/wandb/.
Only when the runs were logged to W&B (their summary has a `wandb` group): `logger=none` runs get neither.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ablate import units
from ablate.config import LoggerConfig
from ablate.logger import wandb_mode
from ablate.report import runs as R
from ablate.report.analyses import ANALYSES
from ablate.report.compare import Report

SPEC_FILE = "wandb_workspace.json"
VERDICT_COLUMNS = ["claim", "check", "claimed", "expected here", "measured", "interval", "n", "verdict"]


def wandb_runs(report: Report) -> Dict[str, object]:
    """{group, project, entity, mode} of the runs' W&B side, or {} when none was logged to W&B."""
    logged = [r for r in report.runs if (r.summary.get("wandb") or {}).get("group")]
    if not logged:
        return {}
    logger = logged[0].config.get("logger") or {}
    return {"groups": sorted({r.summary["wandb"]["group"] for r in logged}), "project": logger.get("project"),
            "entity": logger.get("entity"), "mode": logged[0].summary["wandb"].get("mode", "offline")}


def workspace(report: Report, where: Dict[str, object], entity: Optional[str] = None):
    """The wandb_workspaces.Workspace of these runs (entity: the project's owner, when known)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = []
    for group in report.groups:
        checks = [c for c in report.checks if c.sweep == group.name]
        knob = group.sweep.get("knob", "")
        panels = [wr.BarPlot(title=f"{c.metric}: {c.what or c.metric} ({c.verdict})", metrics=[c.metric],
                             groupby=f"config.{knob}" if knob and "," not in knob else None,
                             groupby_aggfunc="mean", groupby_rangefunc="stderr")
                  for c in _unique(checks)]
        panels += [wr.LinePlot(title=f"{m} against step", x="step", y=[m]) for m in ("tokens_per_s", "loss")]
        knobs = [k.split("=")[0].strip() for k in knob.split(",")] if "," in knob else []
        if knobs:   # a grid over several knobs: each run's path from its settings to its speed
            panels.append(wr.ParallelCoordinatesPlot(title="knobs -> tokens/s", columns=[
                *(wr.ParallelCoordinatesPlotColumn(metric=wr.Config(k)) for k in knobs),
                wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric("tokens_per_s"))]))
        sections.append(ws.Section(name=f"{R.title(group.sweep, group.name)} ({group.name})", panels=panels,
                                    is_open=True, panel_settings=ws.SectionPanelSettings(x_axis="step")))
    for analysis in (a for a in ANALYSES if a.wandb_section):   # analyses.py: each its own section
        sections += [analysis.wandb_section(item) for item in report.found[analysis.key]]
    groups = where["groups"]
    knobs = [g.sweep.get("knob", "") for g in report.groups if "," not in g.sweep.get("knob", ",")]
    runset = ws.RunsetSettings(filters=" or ".join(f"Group = '{g}'" for g in groups),
                               groupby=[ws.Config(knobs[0])] if knobs else [])
    return ws.Workspace(entity=entity_of(where, entity), project=where.get("project") or "ablate",
                        name=f"ablate: {', '.join(groups)}"[:120], sections=sections, runset_settings=runset,
                        settings=ws.WorkspaceSettings(x_axis="step"))


PLACEHOLDER_ENTITY = "your-entity"


def entity_of(where: Dict[str, object], given: Optional[str] = None) -> str:
    """The workspace's owner: given (--entity), the runs' logger.entity, W&B's own variable, else a placeholder the
    saved spec says to replace."""
    return given or where.get("entity") or os.environ.get("WANDB_ENTITY") or PLACEHOLDER_ENTITY


def tune_spec(knobs: List[str], objective: str, where: Dict[str, object]) -> Dict:
    """An `ablate.tune`'s W&B workspace: its trials (their W&B group) as a parallel-coordinates panel from the
    knobs searched to the objective and the peak memory, and the objective against step."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(k if "." in k else f"{k}.name")) for k in knobs]
    columns += [wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(m)) for m in (objective, "mem_peak_bytes")]
    panels = [wr.ParallelCoordinatesPlot(title=f"trials: knobs -> {objective}, peak memory", columns=columns),
              wr.LinePlot(title=f"{objective} against step", x="step", y=[objective])]
    groups = where["groups"]
    runset = ws.RunsetSettings(filters=" or ".join(f"Group = '{g}'" for g in groups))
    return ws.Workspace(entity=entity_of(where), project=where.get("project") or "ablate",
                        name=f"ablate tune: {', '.join(groups)}"[:120], runset_settings=runset,
                        settings=ws.WorkspaceSettings(x_axis="step"),
                        sections=[ws.Section(name=f"tune ({objective})", panels=panels, is_open=True,
                                             panel_settings=ws.SectionPanelSettings(x_axis="step"))])._spec


def _unique(checks):
    seen, out = set(), []
    for c in checks:
        if c.metric not in seen:
            seen.add(c.metric)
            out.append(c)
    return out


def write_spec(out: Path, report: Report, where: Dict[str, object], entity: Optional[str] = None) -> Path:
    path = out / SPEC_FILE
    path.write_text(json.dumps(workspace(report, where, entity)._spec, indent=1))
    return path


def verdict_rows(checks) -> List[list]:
    rows = []
    for c in checks:
        ends = [units.effect(c.effect_kind, v, c.metric) for v in (c.ci_low, c.ci_high)]
        interval = f"[{ends[0]}, {ends[1]}]" if c.ci_low is not None and not c.exact else ""
        rows.append([c.claim, f"{c.metric}: {c.what}", "no claim" if c.claimed is None else
                     units.effect(c.effect_kind, c.claimed, c.metric),
                     units.effect(c.effect_kind, c.expected_here, c.metric) if c.expected_here is not None else "",
                     units.effect(c.effect_kind, c.measured, c.metric), interval, c.n, c.verdict])
    return rows


def log_report_run(out: Path, report: Report, where: Dict[str, object], pictures: List[Path]) -> Optional[str]:
    """The `report` run: the verdict table and the plots, in the runs' group; its id, or None when W&B
    would not start (said in one line: the report's own files are written anyway)."""
    import wandb

    run_id = report_run_id(out)
    for earlier in (out / "wandb").glob(f"*-{run_id}"):   # this folder's report run before: replaced, not added to
        shutil.rmtree(earlier, ignore_errors=True)
    try:
        run = wandb.init(project=where.get("project"), entity=where.get("entity"), group=where["groups"][0],
                         job_type="report", name=f"report {', '.join(where['groups'])}"[:120], dir=str(out),
                         mode="online" if where.get("mode") == "online" else "offline", tags=["report"],
                         id=run_id, resume="allow",
                         settings=wandb.Settings(console="off", quiet=True, silent=True, x_disable_stats=True))
    except Exception as e:   # the report stands without W&B
        print(f"ablate.report: warning: no W&B report run ({type(e).__name__}: {str(e)[:160]})")
        return None
    with run:
        run.log({"verdicts": wandb.Table(columns=VERDICT_COLUMNS, data=verdict_rows(report.checks)),
                 **{f"plots/{p.stem}": wandb.Image(str(p)) for p in pictures if p.exists()}})
        return run.id


def report_run_id(out: Path) -> str:
    """One W&B run per report folder: each `ablate.report D` replaces D's report run instead of adding another."""
    return "report-" + hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:12]


def sync_command(report: Report, out: Path) -> str:
    """`wandb sync` with globs that match every offline run of the report: the runs' own (one level down in a -m
    grid's dir, two in a sweep's, as each run's summary.json records its W&B dir) and the report's run in `out`."""
    dirs = [Path(r.summary["wandb"]["dir"]) for r in report.runs if (r.summary.get("wandb") or {}).get("dir")]
    dirs = [d.resolve() for d in [*dirs, *(out / "wandb").glob("offline-run-*")] if d.name.startswith("offline-run-")]
    if not dirs:
        return "wandb sync <run dir>/wandb/offline-run-*"
    root = Path(os.path.commonpath([str(d.parent.parent) for d in dirs]))
    depths = sorted({len(d.relative_to(root).parts) - 2 for d in dirs})   # (levels between root and each wandb/)
    return "wandb sync " + " ".join(shlex.quote(str(root)) + "/" + "*/" * n + "wandb/offline-run-*" for n in depths)


def push(report: Report, where: Dict[str, object], out: Path) -> int:
    """`--wandb`: save the workspace to the project (online); one line of what it needs when it cannot."""
    import wandb

    if wandb_mode(LoggerConfig()) != "online":   # the same credential rule as the runs
        print("ablate.report: error: --wandb needs W&B credentials (wandb login, or WANDB_API_KEY) and the runs "
              f"uploaded first ({sync_command(report, out)}); the view is in wandb_workspace.json", file=sys.stderr)
        return 2
    given = entity_of(where)
    saved = workspace(report, where, entity=given if given != PLACEHOLDER_ENTITY else wandb.Api().default_entity).save()
    print(f"W&B workspace: {saved.url}")
    return 0
