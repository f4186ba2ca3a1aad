"""`python -m ablate.sweeps` (sweeps/__init__.py: the sweeps and their plan; runner.py: the runs)."""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Tuple

import yaml

from ablate import report
from ablate.config import AblateError, ConfigError, exit_code_of
from ablate.config import arguments as cli
from ablate.config.command_line import split_argv
from ablate.config.sweep import check_batch_search
from ablate.launcher.group import Interrupted, raise_on_sigterm, stopped_between
from ablate.metrics.peak import forget_this_host
from ablate.predict import collectives, here
from ablate.report import compare, sequential
from ablate.report.predicted import PREDICTIONS_FILE, key_of
from ablate.sweeps import __doc__ as SWEEPS_DOC
from ablate.sweeps import allocation, available, check_arms, expand, is_factorial, listing, plan_runs, use_config_dirs
from ablate.sweeps.runner import claim_dir, run_all, unfinished
from ablate.train import guards


def run_until_decided(runs, root: Path, extra: List[str], env: Dict[str, str], args, search,
                      steps=None) -> Tuple[List[str], float]:
    """--repeats auto: a block of repeats at a time; from --min-repeats on, a look at the verdicts (at the
    corrected level) after each block, until every verdict is decided or --max-repeats."""
    confidence, failed, looks, why = sequential.level(args.min_repeats, args.max_repeats), [], [], ""
    for r in range(args.max_repeats):
        block = [run for run in runs if run[2] == r]
        failed += run_all(block, root, extra, env, args.run_timeout, args.until, search,
                          first=sum(1 for run in runs if run[2] < r) + 1, steps=steps, wait_quiet=args.wait_quiet)
        if r + 1 < args.min_repeats:
            continue
        looks.append(r + 1)
        stop, why = sequential.decision(compare.build([root], level=confidence).checks, r + 1, args.max_repeats)
        print(f"look at n={r + 1}: {why}", flush=True)
        if stop:
            break
    sequential.write(root, {"level": confidence, "looks": looks, "stopped": why, "min_repeats": args.min_repeats,
                            "max_repeats": args.max_repeats,
                            "possible_looks": args.max_repeats - args.min_repeats + 1})
    return failed, confidence


def main(argv: List[str] = None) -> int:
    """The command line's edge: what ablate raises becomes one line and an exit code here."""
    raise_on_sigterm()
    try:
        return _main(argv)
    except AblateError as e:
        return exit_code_of(e, "ablate.sweeps")
    except (KeyboardInterrupt, Interrupted) as e:   # between runs: nothing of ours is running
        return exit_code_of(stopped_between(e, "the same command continues the sweep"), "ablate.sweeps")


def overrides_of(extra: List[str]) -> List[str]:
    """The runs' overrides after `--`, a `--config-dir DIR` among them made the override every run takes; the
    dirs of a hydra.searchpath override there are searched for sweeps too (the Slurm driver gets only that)."""
    overrides, dirs = split_argv(extra)
    given = [o for o in overrides if o.startswith("hydra.searchpath=")]
    for o in given:
        use_config_dirs([p.strip()[len("file://"):] for p in o.split("=", 1)[1].strip("[]").split(",")
                         if p.strip().startswith("file://")])
    return [*use_config_dirs(dirs), *overrides]


def check_options(args, auto: bool) -> None:
    """What argparse's types cannot say, refused in one line (no usage block): the option and what it takes."""
    if not args.names:
        raise ConfigError(f"give at least one sweep name; valid choices: {', '.join(available())}")
    if not (auto or args.repeats.isdigit() and int(args.repeats) >= 1):
        raise ConfigError(f"--repeats={args.repeats}: valid choices: an integer >= 1, or auto")
    if not 1 <= args.min_repeats <= args.max_repeats:
        raise ConfigError(f"--min-repeats={args.min_repeats}, --max-repeats={args.max_repeats}: need 1 <= "
                          "--min-repeats <= --max-repeats")
    if args.run_timeout is not None and not args.run_timeout > 0:
        raise ConfigError(f"--run-timeout={args.run_timeout:g}: out of range; allowed: > 0 (seconds per run)")
    batch_search_of(args.batch_search)


def batch_search_of(items: List[str]) -> Dict[str, object]:
    """--batch-search KEY=VALUE ..., each checked as a sweep file's batch_search is."""
    spec = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--batch-search {item}: give KEY=VALUE (e.g. limit=512)")
        spec[key] = yaml.safe_load(value)
    check_batch_search(spec, "--batch-search")
    return spec


def parser() -> argparse.ArgumentParser:
    """`python -m ablate.sweeps`'s options."""
    p = argparse.ArgumentParser(prog="python -m ablate.sweeps", description=SWEEPS_DOC.split("\n\n")[1],
                                     epilog="example: python -m ablate.sweeps c3_no_sync --repeats 3 -- logger=none")
    p.add_argument("names", nargs="*", help="sweeps/ files (week4: all of them); see --list")
    p.add_argument("--list", action="store_true", help="list the sweeps with their claim, knob and arms")
    p.add_argument("--config-dir", action="append", default=[], metavar="DIR", type=cli.in_dir,
                        help="a config dir of your own: DIR/sweeps/NAME.yaml are sweeps, DIR/<group>/ choices of "
                             "every run (as python -m ablate --config-dir)")
    p.add_argument("--repeats", default="1", help="runs per arm (default 1: no interval), or auto: add "
                        "repeats until every verdict is decided (report/sequential.py)")
    p.add_argument("--min-repeats", type=cli.count, default=2, help="with --repeats auto: the first look")
    p.add_argument("--max-repeats", type=cli.count, default=5, help="with --repeats auto: the last look")
    p.add_argument("--dir", type=cli.out_dir, help="output folder (default multirun/<names>_<time>)")
    p.add_argument("--order", choices=("interleaved", "random"), default=None,
                        help="interleaved (A B, A B, ...: the default) or random blocks (the default of a factorial "
                             "design: each repeat a block in its own random order)")
    p.add_argument("--seed", type=cli.count0, default=0, help="seed of --order random")
    p.add_argument("--run-timeout", type=cli.positive, help="seconds per run (and per batch search); a run past "
                        "it is killed and named, the sweep goes on")
    p.add_argument("--until", type=cli.positive, help="a Unix time: runs that would start after it are not run "
                        "(and named); a run's timeout never passes it")
    p.add_argument("--batch-search", action="append", default=[], metavar="KEY=VALUE",
                        help="change a sweep's batch_search (e.g. multiple_of=64, limit=512, start=64)")
    p.add_argument("--repeat-side-arms", action="store_true",
                        help="repeat arms that are neither baseline nor treatment too (default: once)")
    p.add_argument("--wait-quiet", type=cli.positive, metavar="SECONDS", help="before each run, wait at most this "
                        "long for the host's CPU to be under 25%% busy (other processes skew timings; each run "
                        "records host_load either way)")
    p.add_argument("--measure-peak", action="store_true", help="measure this host's peak FLOP/s again at the "
                        "first run (every run and sweep here reuses the cached one until the hardware or torch "
                        "changes), and gloo's collectives again at the next prediction (--predict)")
    p.add_argument("--predict", action="store_true", help="before the runs, predict each arm's step on this machine "
                   "(ablate.plan --hardware here, docs/prediction.md) into DIR/predictions.json; the report sets it "
                   "beside the measured step")
    p.add_argument("--no-wait", action="store_true", help="with launcher=slurm: submit the sweep's one "
                        "allocation and return (default: follow it here until its report is written)")
    return p


def _main(argv: List[str] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    argv, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser().parse_args(argv)
    extra = [*use_config_dirs(args.config_dir), *overrides_of(extra)]
    if args.list:
        print(listing())
        return 0
    auto = args.repeats == "auto"
    check_options(args, auto)
    repeats = args.max_repeats if auto else int(args.repeats)
    runs = plan_runs(expand(args.names), extra, repeats, args.order, args.seed,
                     side_arms_once=not args.repeat_side_arms)
    configs = allocation.configs(runs)
    for name in dict.fromkeys(n for n, _, _ in runs):   # its baseline and treatments are among its runs
        check_arms(name, [configs[tuple(c)] for n, c, _ in runs if n == name])
    root = args.dir or Path("multirun") / f"{'-'.join(args.names)}_{datetime.now():%Y-%m-%d_%H-%M-%S}"
    refused = claim_dir(root, runs)
    if refused:
        raise ConfigError(refused)
    order = args.order or ("random blocks" if any(is_factorial(n) for n in expand(args.names)) else "interleaved")
    print(f"{len(runs)} runs ({'up to ' if auto else ''}{repeats} repeat(s), {order}) into {root}", flush=True)
    steps = None
    if allocation.allocates(configs) and not allocation.inside() and unfinished(runs, root, extra):
        live = allocation.live_job(root)
        if live:
            print(f"Slurm job {live} already runs this sweep: following it", flush=True)
            return allocation.follow(live, root, allocation.largest(configs).launcher.cancel_unrunnable)
        # one Slurm allocation for the whole sweep: this same command is its driver inside it
        return allocation.submit(root, driver_command(args, root, extra), configs, wait=not args.no_wait)
    if allocation.allocates(configs) and allocation.inside():
        steps = allocation.Steps(configs)
    guards.hold(root, "ablate.sweeps", "sweep")
    if args.measure_peak:
        print(f"collectives: {collectives.forget_this_host()} cached probe(s) of this host dropped; the next "
              "prediction measures again", flush=True)
        print(f"peak FLOP/s: {forget_this_host()} cached figure(s) of this host dropped; the first run measures "
              "again", flush=True)
    if args.predict:   # (after --measure-peak: a prediction probes anew what it drops)
        predict_arms(root, runs, configs)
    search = batch_search_of(args.batch_search)
    env = {"ABLATE_PREFLIGHT_DONE": "1"}
    if auto:
        failed, confidence = run_until_decided(runs, root, extra, env, args, search, steps)
    else:
        failed = run_all(runs, root, extra, env, args.run_timeout, args.until, search, steps=steps,
                         wait_quiet=args.wait_quiet)
        confidence = 0.95
    code = report.main([str(root), "--confidence", str(confidence)]) if root.exists() else 2
    if failed:
        print(f"ablate.sweeps: {len(failed)} run(s) failed: {'; '.join(failed)} (named in the report)",
              file=sys.stderr)
    return allocation.finish(root, 1 if failed else code)


def predict_arms(root: Path, runs, configs) -> None:
    """--predict: each distinct arm's step on this machine, before any of them runs (an earlier call's kept)."""
    path = root / PREDICTIONS_FILE
    try:
        made = json.loads(path.read_text())
    except (OSError, ValueError):
        made = {}
    for combo in dict.fromkeys(tuple(c) for _, c, _ in runs):
        if key_of(list(combo)) not in made:
            print(f"predicting {' '.join(combo) or '(the sweep as it is)'} on this machine", flush=True)
            made[key_of(list(combo))] = here.predict(configs[combo])
            path.write_text(json.dumps(made, indent=1))


def driver_command(args, root: Path, extra: List[str]) -> List[str]:
    """This call's arguments as the allocation's driver gets them: every option explicit, --dir absolute."""
    flags = [*args.names, f"--repeats={args.repeats}", f"--min-repeats={args.min_repeats}",
             f"--max-repeats={args.max_repeats}", f"--dir={root.resolve()}", f"--seed={args.seed}",
             *([f"--order={args.order}"] if args.order else []),
             *([f"--run-timeout={args.run_timeout}"] if args.run_timeout else []),
             *([f"--until={args.until}"] if args.until else []),
             *([f"--wait-quiet={args.wait_quiet}"] if args.wait_quiet else []),
             *[f"--batch-search={kv}" for kv in args.batch_search],
             *(["--repeat-side-arms"] if args.repeat_side_arms else [])]
    return ["-u", "-m", "ablate.sweeps", *flags, "--", *extra]   # the same plan (D/plan.json): a run inside a
    # job step trains whatever launcher.dry_run says (launcher/__init__.py launch_slurm)


if __name__ == "__main__":
    sys.exit(main())
