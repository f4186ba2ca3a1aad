"""`python -m ablate.baseline save D --name NAME | check D --against NAME | list | show NAME [--store DIR]`.

check exits 1 when any figure regressed or a count changed, 0 otherwise, 2 on bad input (one line); it writes
D/check.md and D/check.json, and appends its table to $GITHUB_STEP_SUMMARY when that is set (a GitHub Actions
job summary).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List

from ablate import baseline, units
from ablate.baseline import check as C
from ablate.config import AblateError, ConfigError, exit_code_of
from ablate.config import arguments as cli

EXIT_REGRESSED = 1


def threshold_of(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise ConfigError(f"--threshold {text}: not a number; allowed: a share in (0, 1) or a percentage (5%)") \
            from None
    if not 0 < value < 1:
        raise ConfigError(f"--threshold {text}: out of range; allowed: a share in (0, 1) or a percentage (5%)")
    return value


def shown(metric: str, row: C.Row) -> str:
    if metric in baseline.EXACT and row.baseline is not None and row.baseline == row.today:
        return "same"
    if row.change is None:
        return "—"
    if row.ci_low is None or metric in baseline.EXACT:
        return f"x{row.change:.4g}"
    return f"x{row.change:.3g} [x{row.ci_low:.3g}, x{row.ci_high:.3g}]"


def markdown(name: str, base, today, rows: List[C.Row], threshold: float, diffs: List[str]) -> str:
    counts = {v: sum(r.verdict == v for r in rows) for v in C.VERDICTS}
    lines = [f"# ablate regression gate: `{today['source']}` against baseline `{name}`", "",
             f"Baseline saved {base['saved_at']} from `{base['source']}`. Threshold ±{threshold:.0%}; "
             "a timed figure regressed when its whole 95% interval (Welch, today / baseline) is past it on the "
             "worse side; a count is flagged changed when it changed at all (which way, and whether that is "
             "better, in its reason).", "",
             "**Verdicts**: " + ", ".join(f"{v} {n}" for v, n in counts.items() if n) + ".", ""]
    lines += (["**What differs**:", ""] + [f"- {d}" for d in diffs] + [""]) if diffs else \
        ["Same commit, versions, host and configs.", ""]
    lines += ["| arm | figure | baseline | today | change [95% CI] | n | verdict | reason |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        before, after = (units.fmt(r.metric, v) if v is not None else "—" for v in (r.baseline, r.today))
        lines.append(f"| {r.arm} | {r.metric} | {before} | {after} | {shown(r.metric, r)} | "
                     f"{r.n_baseline}/{r.n_today} | **{r.verdict}** | {r.reason} |")
    return "\n".join(lines) + "\n"


def run_check(args) -> int:
    threshold = threshold_of(args.threshold)
    base = baseline.load(args.against, args.store)
    today = baseline.record(args.dir, "today")
    other = set(today["hardware"]) != set(base["hardware"])
    if other and not args.allow_other_hardware:
        raise ConfigError(f"--against {args.against}: measured on {'; '.join(base['hardware'])}, today's runs on "
                          f"{'; '.join(today['hardware'])}: timings do not compare across hardware "
                          "(--allow-other-hardware to check anyway)")
    unknown = [m for m in args.metrics if m not in (*baseline.TIMED, *baseline.EXACT)]
    if unknown:
        raise ConfigError(f"--metrics {unknown[0]}: not a figure the gate compares; valid choices: "
                          f"{', '.join((*baseline.TIMED, *baseline.EXACT))}")
    rows = C.compare(base["arms"], today["arms"], threshold, args.metrics)
    diffs = C.differences(base, today)
    text = markdown(args.against, base, today, rows, threshold, diffs)
    (args.dir / "check.md").write_text(text)
    (args.dir / "check.json").write_text(json.dumps({"baseline": args.against, "threshold": threshold,
                                                     "differences": diffs, "rows": C.as_json(rows)}, indent=1))
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
            f.write(text)
    for d in diffs:
        print(f"differs: {d}")
    for r in rows:
        print(f"{r.verdict:<12} {r.arm}  {r.metric}: {shown(r.metric, r)}" + (f"  ({r.reason})" if r.reason else ""))
    regressed = [r for r in rows if r.verdict == "regressed"]
    changed = [r for r in rows if r.verdict == "changed"]
    print(f"{len(regressed)} regression(s), {len(changed)} changed count(s) against `{args.against}`; "
          f"{args.dir / 'check.md'}")
    return EXIT_REGRESSED if regressed or changed else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ablate.baseline", description=baseline.__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    save = sub.add_parser("save", help="keep a finished sweep's figures as a baseline")
    save.add_argument("dir", type=cli.in_dir)
    save.add_argument("--name", required=True, type=cli.file_name)
    check = sub.add_parser("check", help="today's sweep against a baseline: exit 1 on a regression")
    check.add_argument("dir", type=cli.in_dir)
    check.add_argument("--against", required=True, metavar="NAME", type=cli.file_name)
    check.add_argument("--threshold", default="5%", help="the change that matters (default 5%%)")
    check.add_argument("--metrics", nargs="+", default=[], help="the figures to compare (default: all)")
    check.add_argument("--allow-other-hardware", action="store_true")
    sub.add_parser("list", help="the baselines in the store")
    show = sub.add_parser("show", help="one baseline: where it came from and its arms")
    show.add_argument("name", type=cli.file_name)
    for each in (save, check, show, sub.choices["list"]):
        each.add_argument("--store", type=cli.out_dir,
                          help="the baselines' folder (default: the user cache; a shared folder for a team)")
    return p


def main(argv: List[str] = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "save":
            path = baseline.save(args.dir, args.name, args.store)
            print(f"baseline `{args.name}`: {path}")
            return 0
        if args.command == "list":
            print("\n".join(baseline.listing(args.store)) or f"no baselines in {baseline.store_dir(args.store)}")
            return 0
        if args.command == "show":
            entry = baseline.load(args.name, args.store, given="show ")
            print(json.dumps({k: v for k, v in entry.items() if k != "arms"}, indent=1))
            for arm, kept in entry["arms"].items():
                print(f"{arm}: {len(kept['runs'])} run(s)")
            return 0
        return run_check(args)
    except AblateError as e:
        return exit_code_of(e, "ablate.baseline")


if __name__ == "__main__":
    sys.exit(main())
