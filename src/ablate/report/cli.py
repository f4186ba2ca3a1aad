"""`python -m ablate.report DIR [DIR ...]`: the command line of the report (built in report/compare.py), its
refusals in one line with exit code 2, and where each file went."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

from ablate.config import arguments as cli
from ablate.report import compare, wandb_view
from ablate.report import output as report_output
from ablate.report.analyses import ANALYSES


def parser() -> argparse.ArgumentParser:
    """`python -m ablate.report`'s options."""
    p = argparse.ArgumentParser(prog="python -m ablate.report", description=(
        "Claimed vs measured for runs of sweeps/ files, or a comparison of any runs (the knob is inferred "
        "from their configs): effects with 95% intervals over repeats and a verdict per check."))
    p.add_argument("dirs", nargs="+", type=cli.in_dir, help="run directories or multirun/sweep directories")
    p.add_argument("--out", type=cli.out_dir,
                        help="where report.md/.csv/PNG go (default: the first directory when it "
                        "is a sweep's, else report-<names> beside the first run: a run's own folder is never written)")
    p.add_argument("--mixed-hardware", action="store_true",
                        help="pair runs made on different hardware (refused by default)")
    p.add_argument("--confidence", type=cli.share, default=0.95,
                        help="the intervals' level (default 0.95; ablate.sweeps --repeats auto passes a corrected one)")
    p.add_argument("--entity", default=None, help="the W&B entity the workspace spec names (default: the runs' "
                        "logger.entity, else $WANDB_ENTITY)")
    p.add_argument("--wandb", action="store_true", help="save the W&B workspace of these runs to their project "
                        "(online; after `wandb sync` of offline runs)")
    return p


def main(argv: List[str] = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    missing = [d for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"ablate.report: error: not a directory: {missing[0]}", file=sys.stderr)
        return 2
    report = compare.build(args.dirs, args.mixed_hardware, args.confidence)
    if not report.checks and not report.runs and report.unfinished:
        shown = ", ".join(map(str, report.unfinished[:3])) + (" ..." if len(report.unfinished) > 3 else "")
        print(f"ablate.report: error: nothing to compare: {len(report.unfinished)} run(s) did not finish (no "
              f"summary.json): {shown}; continue one with python -m ablate train.resume=<its dir>", file=sys.stderr)
        return 2
    if report.compares_nothing():
        print(f"ablate.report: error: nothing to compare under {', '.join(map(str, args.dirs))}: no runs of a "
              "sweeps/ file, and no two runs that differ in a knob (run e.g. python -m ablate.sweeps c3_no_sync)",
              file=sys.stderr)
        return 2
    out = args.out or default_out(args.dirs)
    if is_a_run(out):
        print(f"ablate.report: error: --out {out} is a run's folder: a report never writes into a run; give another "
              "--out DIR", file=sys.stderr)
        return 2
    try:
        out.mkdir(parents=True, exist_ok=True)
        path = report_output.write(out, report)
    except OSError as e:   # a read-only or full folder: the report is built, it cannot be kept there
        print(f"ablate.report: error: {out}: the report cannot be written ({e.strerror or type(e).__name__}: "
              f"{e.filename or out}); give --out DIR", file=sys.stderr)
        return 2
    compare.write_csv(out / "report.csv", report.checks)
    tables = ["report.csv"]
    for analysis in (a for a in ANALYSES if report.found[a.key]):
        analysis.write_csv(out / analysis.csv, report.found[analysis.key])
        tables.append(analysis.csv)
    report_output.print_table(report)
    print(f"report: {path} (and {', '.join(tables)}, {len(list(out.glob('*.png')))} PNG)")
    where = wandb_view.wandb_runs(report)
    if where:   # the runs went to W&B: their view as code, and the verdicts as a run of the same group
        spec = wandb_view.write_spec(out, report, where, args.entity)
        run_id = wandb_view.log_report_run(out, report, where, sorted(out.glob("*.png")))
        print(f"W&B: workspace spec {spec}; verdicts in the report run {run_id} ({where['mode']}, group "
              f"{', '.join(where['groups'])}); `--wandb` saves the workspace to the project")
    if args.wandb:
        return wandb_view.push(report, {**where, "entity": args.entity or where.get("entity")}, out) if where \
            else _no_wandb_runs()
    return 0


def is_a_run(path: Path) -> bool:
    """A run's own folder (its resolved config, or its record): what a report must leave as it is."""
    return (path / "config.yaml").is_file() or (path / "summary.json").is_file()


def default_out(dirs: List[Path]) -> Path:
    """The first directory when it holds runs (a sweep's, a multirun's); for runs given by their own folders, a
    folder beside the first of them named after them all."""
    first = dirs[0]
    if not is_a_run(first):
        return first
    name = "report-" + "-".join(d.resolve().name for d in dirs)
    return first.resolve().parent / (name if len(name) <= 100 else name[:91] + f"-{len(dirs)}-runs")


def _no_wandb_runs() -> int:
    print("ablate.report: error: --wandb: none of these runs was logged to W&B (they ran with logger=none)",
          file=sys.stderr)
    return 2
