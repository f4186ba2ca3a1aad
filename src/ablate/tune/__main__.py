"""`python -m ablate.tune --space K=V1,V2 [--space ...] [--objective F] [--trials N] [--mem-budget-gb G]
[--confirm R] --dir D [-- OVERRIDES]` (tune/__init__.py: the space, pruning, a trial).

Optuna's TPE sampler (seeded), or the whole grid when it has no more points than --trials; the study lives in
D/optuna.db, so the same command continues an interrupted tune. Writes D/tune.csv (a row a trial), D/best.yaml
(the winner's overrides: `python -m ablate $(cat D/best.yaml)`), D/report.md and D/tune.png (objective
against peak memory, the budget line, the Pareto front).

With launcher=slurm (in the overrides or the space) the tune is ONE Slurm allocation, like ablate.sweeps: typed
outside a job, it writes D/tune.sbatch (the nodes of its largest trial) and submits it, and this same command
is the driver inside it, each trial a job step; its lines stream here until it ends. A requeued allocation
(preemption, the time-limit warning) continues the tune from D/optuna.db, the stopped trial again.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

from ablate import units
from ablate.config import AblateError, ConfigError, exit_code_of
from ablate.config import arguments as cli
from ablate.config.command_line import config_dir_override
from ablate.launcher.group import Interrupted, raise_on_sigterm, stopped_between
from ablate.sweeps import allocation
from ablate.train import guards
from ablate.tune import (
    Trial,
    best_two,
    check_objective,
    direction,
    grid_size,
    output,
    parse_space,
    prune_reason,
    run_trial,
)
from ablate.tune.slurm import Steps, driver_command, trial_configs

STUDY = "ablate-tune"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ablate.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--space", action="extend", nargs="+", default=[], metavar="KEY=V1,V2", help="knobs and their "
                   "choices, one flag or several (any group or key: --space parallel=ddp,fsdp2 "
                   "train.batch_size=8,16 --space precision=fp32,bf16)")
    p.add_argument("--objective", default="tokens_per_s", help="a summary.json figure (default tokens_per_s; "
                   "step times and memory are minimised, the rest maximised)")
    p.add_argument("--trials", type=cli.count, default=12, help="distinct points to measure, pruned ones included; "
                   "a point the sampler asks for again reuses its figures (default 12)")
    p.add_argument("--mem-budget-gb", type=cli.positive, help="prune what the planner says cannot fit, per rank")
    p.add_argument("--confirm", type=cli.count0, default=0, metavar="R", help="run the best two R more times each, "
                   "interleaved, and say whether the winner beats the runner-up")
    p.add_argument("--config-dir", action="append", default=[], metavar="DIR", type=cli.in_dir,
                   help="a config dir of your own "
                   "(model/, optim/, ... files): its choices join every group, for every trial")
    p.add_argument("--dir", type=cli.out_dir, required=True)
    p.add_argument("--seed", type=cli.count0, default=0)
    p.add_argument("--trial-timeout", type=cli.positive, help="seconds per trial (a trial past it fails)")
    p.add_argument("--no-wait", action="store_true", help="with launcher=slurm: submit the tune's one allocation "
                   "and return (default: follow it here until its report is written)")
    return p


def sampler(space: Dict[str, List[str]], trials: int, seed: int):
    import optuna

    class Grid(optuna.samplers.GridSampler):
        def after_trial(self, study, trial, state, values) -> None:
            """Nothing: optuna's grid calls Study.stop at its last point, which raises outside study.optimize;
            this tune asks and tells by itself, and ends when `left` finds every point measured."""

    if grid_size(space) <= trials:   # small: every point, in a seeded order
        return Grid(space, seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def recorded(study) -> List[Trial]:
    """Every trial the study holds (a continued tune: the earlier calls' too)."""
    out = []
    for t in study.trials:
        a = t.user_attrs
        if "state" in a:
            out.append(Trial(t.number, a["overrides"], a["state"], a.get("objective"), a.get("mem_peak_bytes"),
                             a.get("reason", ""), a.get("run_dir", ""), a.get("seconds", 0.0)))
    return out


def one_trial(study, space, base: List[str], args, budget: Optional[float], earlier: Dict[str, Trial],
              steps: Steps) -> Trial:
    import optuna

    t = study.ask({k: optuna.distributions.CategoricalDistribution(v) for k, v in space.items()})
    overrides = [*base, *[f"{k}={t.params[k]}" for k in space]]
    trial = Trial(t.number, overrides)
    key = " ".join(overrides)
    if key in earlier:   # the sampler asked for a point already measured: its figures, not another run
        old = earlier[key]
        trial.state, trial.objective, trial.mem_peak_bytes = old.state, old.objective, old.mem_peak_bytes
        trial.reason, trial.run_dir = f"the same point as trial {old.number}", old.run_dir
    else:
        reason = prune_reason(overrides, budget)
        if reason:
            trial.state, trial.reason = "pruned", reason
        else:
            run_trial(trial, args.dir / "trials" / f"{t.number:03d}", args.objective, args.trial_timeout,
                      steps.prefix(overrides, f"ablate-trial-{t.number:03d}"))
            steps.requeue_if_warned(f"trial {t.number}")   # not recorded: the next attempt runs it again
            if budget and trial.state == "complete" and (trial.mem_peak_bytes or 0) > budget:
                trial.state = "oom"   # it ran, but past the budget: no winner can be one
                trial.reason = f"peak {units.fmt('bytes', trial.mem_peak_bytes)} over the budget"
    for k, v in asdict(trial).items():
        if k not in ("number", "extra"):
            t.set_user_attr(k, v)
    state = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED}.get(
        trial.state, optuna.trial.TrialState.FAIL)
    study.tell(t, trial.objective if trial.state == "complete" else None, state=state)
    shown = units.fmt(args.objective, trial.objective) if trial.objective is not None else "—"
    print(f"trial {t.number}: {' '.join(overrides[len(base):])}: {trial.state} {shown}"
          + (f" ({trial.reason})" if trial.reason else "") + (f", {trial.seconds:.0f} s" if trial.seconds else ""),
          flush=True)
    return trial


def confirm(winner: Trial, runner: Trial, args, steps: Steps) -> Dict[str, object]:
    """The best two R more times each, interleaved (A B, A B, ...), then the winner / runner-up ratio."""
    from ablate.report import stats

    values: Dict[int, List[float]] = {winner.number: [], runner.number: []}
    for r in range(args.confirm):
        for t in (winner, runner):
            again = Trial(t.number, t.overrides)
            run_trial(again, args.dir / "confirm" / f"{t.number:03d}_r{r}", args.objective, args.trial_timeout,
                      steps.prefix(t.overrides, f"ablate-confirm-{t.number:03d}-{r}"))
            steps.requeue_if_warned(f"confirm {r + 1}/{args.confirm}")
            if again.objective is not None:
                values[t.number].append(again.objective)
            print(f"confirm {r + 1}/{args.confirm}: trial {t.number}: {again.state} "
                  f"{units.fmt(args.objective, again.objective) if again.objective else '—'}", flush=True)
    est = stats.estimate("ratio", values[runner.number], values[winner.number])
    if est is None or est.ci_low is None:
        why = stats.no_interval_text(est) if est is not None else "a run of each is missing"
        more = ": use --confirm 3 or more" if args.confirm < 3 else ""
        return {"values": values, "text": f"no interval from the confirmation ({why}){more}; the winner is not "
                                          "shown to beat the runner-up"}
    outcome = verdict(est.ci_low, est.ci_high, direction(args.objective) == "maximize")
    said = {"beats": "the winner beats the runner-up.",
            "loses": f"the runner-up beats the winner: the interval lies wholly on its side, so trial {runner.number} "
                     "is the best (best.yaml).",
            "same": "indistinguishable here: the interval holds no change (x1); either is as good on this machine."}
    text = (f"trial {winner.number} / trial {runner.number}: x{est.median:.3g} [x{est.ci_low:.3g}, "
            f"x{est.ci_high:.3g}] ({args.objective}, n={est.n} interleaved pairs): {said[outcome]}")
    return {"values": values, "ratio": est.median, "ci_low": est.ci_low, "ci_high": est.ci_high,
            "beats": outcome == "beats", "outcome": outcome,
            "best": runner.number if outcome == "loses" else winner.number, "text": text}


def verdict(ci_low: float, ci_high: float, maximise: bool) -> str:
    """The winner / runner-up ratio's interval: wholly on the winner's side (beats), wholly on the runner-up's
    (loses), or holding x1 (same)."""
    if ci_low > 1 or ci_high < 1:
        winner_side = ci_low > 1 if maximise else ci_high < 1
        return "beats" if winner_side else "loses"
    return "same"


def run(args, base: List[str]) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = parse_space(args.space)
    if args.trials < 1 or args.confirm < 0:
        raise ConfigError(f"--trials {args.trials}, --confirm {args.confirm}: need --trials >= 1, --confirm >= 0")
    budget = args.mem_budget_gb * 1e9 if args.mem_budget_gb else None
    given = base
    if not any(o.startswith("logger.group=") for o in base):   # one W&B group for the trials of this tune
        base = [*base, f"logger.group='tune-{args.dir.resolve().name}'"]
    configs = trial_configs(space, base)   # every point composed with the fixed overrides: one line if one cannot
    for cfg in configs.values():            # the objective is a figure each trial will record, said before any runs
        check_objective(args.objective, cfg.metrics.collectors)
    if not (allocation.allocates(configs) and not allocation.inside()):   # this call runs the trials: it owns
        guards.hold(args.dir, "ablate.tune", "tune")                       # --dir before the study is opened
    args.dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name=STUDY, storage=f"sqlite:///{args.dir.resolve() / 'optuna.db'}",
                                load_if_exists=True, direction=direction(args.objective),
                                sampler=sampler(space, args.trials, args.seed))
    resume_interrupted(study, args.dir)
    trials = recorded(study)
    if allocation.allocates(configs) and not allocation.inside() and (args.confirm or left(trials, space, args)):
        live = allocation.live_job(args.dir)
        if live:
            print(f"Slurm job {live} already runs this tune: following it", flush=True)
            return allocation.follow(live, args.dir, allocation.largest(configs).launcher.cancel_unrunnable,
                                     allocation.TUNE)
        # one Slurm allocation for the whole tune: this same command is its driver inside it
        return allocation.submit(args.dir, driver_command(args, given), configs, wait=not args.no_wait,
                                 what=allocation.TUNE)
    steps = Steps(configs if allocation.inside() else {})
    if trials:
        print(f"continuing the tune in {args.dir}: {len(trials)} trial(s) already done", flush=True)
    while left(trials, space, args):
        earlier = {" ".join(t.overrides): t for t in trials if t.state in ("complete", "pruned")}
        trials.append(one_trial(study, space, base, args, budget, earlier, steps))
    winner, runner = best_two(trials, direction(args.objective) == "maximize")
    confirmed = confirm(winner, runner, args, steps) if args.confirm and winner and runner else None
    output.write(args, trials, base, budget, confirmed)
    return allocation.finish(args.dir, 0 if winner else 1)


def resume_interrupted(study, root: Path) -> None:
    """The trials an interrupted call left running (killed with -9: it told the study nothing): the run it left
    going is ended (its process group), the trial told as failed, and its point asked for again first, so that it
    is measured once and the sampler does not go round a grid it thinks exhausted."""
    import optuna

    for t in study.trials:
        if t.state != optuna.trial.TrialState.RUNNING:
            continue
        orphan = guards.stop_holder(root / "trials" / f"{t.number:03d}")
        if orphan:
            print(f"trial {t.number}: the interrupted call's run (pid {orphan}) was still going: ended", flush=True)
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        if t.params:
            study.enqueue_trial(t.params)


ASKS_PER_TRIAL = 10   # TPE may ask again for a point already measured (free: its figures are reused): bounded


def left(trials: List[Trial], space: Dict[str, List[str]], args) -> bool:
    """Whether a trial is still to run: fewer than --trials distinct points measured, a point of the space not
    yet measured, and (a sampler asking again and again for measured points) fewer than ASKS_PER_TRIAL asks
    per trial."""
    measured = len({" ".join(t.overrides) for t in trials})
    return measured < min(args.trials, grid_size(space)) and len(trials) < ASKS_PER_TRIAL * args.trials


def main(argv: List[str] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    argv, base = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    raise_on_sigterm()   # SIGTERM, like Ctrl-C, reaches the trial in progress (launcher/group.py)
    try:
        args = parser().parse_args(argv)
        return run(args, [*config_dir_override(args.config_dir), *base])
    except AblateError as e:
        return exit_code_of(e, "ablate.tune")
    except (KeyboardInterrupt, Interrupted) as e:
        return exit_code_of(stopped_between(e, "the same command continues the tune"), "ablate.tune")


if __name__ == "__main__":
    sys.exit(main())
