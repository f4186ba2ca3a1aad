"""`python -m ablate.tune --space K=V1,V2 [--space ...] [--objective F] [--trials N] [--mem-budget-gb G]
[--confirm R] --dir D [-- OVERRIDES]` (tune/__init__.py: the space, pruning, a trial).

Optuna's TPE sampler (seeded), or the whole grid when it has no more points than --trials; the study lives in
D/optuna.db, so the same command continues an interrupted tune. Writes D/tune.csv (a row a trial), D/best.yaml
(the winner's overrides: `python -m ablate $(cat D/best.yaml)`), D/report.md and D/tune.png (objective
against peak memory, the budget line, the Pareto front).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

from ablate import units
from ablate.config import AblateError, ConfigError, exit_code_of
from ablate.tune import Trial, best_two, direction, pareto, parse_space, prune_reason, run_trial

STUDY = "ablate-tune"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ablate.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--space", action="append", default=[], metavar="KEY=V1,V2", help="a knob and its choices "
                   "(any group or key: parallel=ddp,fsdp2, train.batch_size=8,16, precision=fp32,bf16)")
    p.add_argument("--objective", default="tokens_per_s", help="a summary.json figure (default tokens_per_s; "
                   "step times and memory are minimised, the rest maximised)")
    p.add_argument("--trials", type=int, default=12, help="trials in all, pruned ones included (default 12)")
    p.add_argument("--mem-budget-gb", type=float, help="prune what the planner says cannot fit, per rank")
    p.add_argument("--confirm", type=int, default=0, metavar="R", help="run the best two R more times each, "
                   "interleaved, and say whether the winner beats the runner-up")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trial-timeout", type=float, help="seconds per trial (a trial past it fails)")
    return p


def sampler(space: Dict[str, List[str]], trials: int, seed: int):
    import optuna

    if len(list(itertools.product(*space.values()))) <= trials:   # small: every point, in a seeded order
        return optuna.samplers.GridSampler(space, seed=seed)
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


def one_trial(study, space, base: List[str], args, budget: Optional[float], earlier: Dict[str, Trial]) -> Trial:
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
            run_trial(trial, args.dir / "trials" / f"{t.number:03d}", args.objective, args.trial_timeout)
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


def confirm(winner: Trial, runner: Trial, args) -> Dict[str, object]:
    """The best two R more times each, interleaved (A B, A B, ...), then the winner / runner-up ratio."""
    from ablate.report import stats

    values: Dict[int, List[float]] = {winner.number: [], runner.number: []}
    for r in range(args.confirm):
        for t in (winner, runner):
            again = Trial(t.number, t.overrides)
            run_trial(again, args.dir / "confirm" / f"{t.number:03d}_r{r}", args.objective, args.trial_timeout)
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
    maximise = direction(args.objective) == "maximize"
    beats = est.ci_low > 1 if maximise else est.ci_high < 1
    text = (f"trial {winner.number} / trial {runner.number}: x{est.median:.3g} [x{est.ci_low:.3g}, "
            f"x{est.ci_high:.3g}] ({args.objective}, n={est.n} interleaved pairs): "
            + ("the winner beats the runner-up." if beats else "indistinguishable here: the interval holds no "
               "change; either is as good on this machine."))
    return {"values": values, "ratio": est.median, "ci_low": est.ci_low, "ci_high": est.ci_high, "beats": beats,
            "text": text}


def write(args, trials: List[Trial], base: List[str], budget: Optional[float], confirmed) -> None:
    d, maximise = args.dir, direction(args.objective) == "maximize"
    with (d / "tune.csv").open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["trial", "overrides", "state", "objective", "mem_peak_bytes", "reason", "seconds"])
        for t in trials:
            out.writerow([t.number, " ".join(t.overrides[len(base):]), t.state, t.objective, t.mem_peak_bytes,
                          t.reason, t.seconds])
    winner, runner = best_two(trials, maximise)
    if winner:
        (d / "best.yaml").write_text("\n".join(winner.overrides) + "\n")
    front = pareto(trials, maximise)
    plot = draw(d, trials, front, budget, args.objective)
    counts = {s: sum(t.state == s for t in trials) for s in ("complete", "pruned", "failed", "oom")}
    lines = [f"# ablate tune: {args.objective} ({direction(args.objective)})", "",
             f"{len(trials)} trials: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
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
              f"{units.fmt('bytes', t.mem_peak_bytes) if t.mem_peak_bytes else '—'} | {t.reason} |" for t in trials]
    lines += ["", f"Pareto front (no trial is better on both): {', '.join(str(t.number) for t in front) or '—'}."]
    lines += (["", f"![tune]({plot})"] if plot else [])
    (d / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:6]))
    print(f"report: {d / 'report.md'} (and tune.csv, best.yaml{', ' + plot if plot else ''})")


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


def run(args, base: List[str]) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = parse_space(args.space)
    if args.trials < 1 or args.confirm < 0:
        raise ConfigError(f"--trials {args.trials}, --confirm {args.confirm}: need --trials >= 1, --confirm >= 0")
    budget = args.mem_budget_gb * 1e9 if args.mem_budget_gb else None
    prune_reason(base, None)   # the fixed overrides compose, before any trial (one line if not)
    args.dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name=STUDY, storage=f"sqlite:///{args.dir.resolve() / 'optuna.db'}",
                                load_if_exists=True, direction=direction(args.objective),
                                sampler=sampler(space, args.trials, args.seed))
    for t in study.trials:   # a trial an interrupted call left running: it never finished
        if t.state == optuna.trial.TrialState.RUNNING:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    trials = recorded(study)
    if trials:
        print(f"continuing the tune in {args.dir}: {len(trials)} trial(s) already done", flush=True)
    while len(trials) < args.trials:
        earlier = {" ".join(t.overrides): t for t in trials if t.state in ("complete", "pruned")}
        trials.append(one_trial(study, space, base, args, budget, earlier))
        if isinstance(study.sampler, optuna.samplers.GridSampler) and len({" ".join(t.overrides) for t in trials}) \
                >= len(list(itertools.product(*space.values()))):
            break   # the whole grid is done
    winner, runner = best_two(trials, direction(args.objective) == "maximize")
    confirmed = confirm(winner, runner, args) if args.confirm and winner and runner else None
    write(args, trials, base, budget, confirmed)
    return 0 if winner else 1


def main(argv: List[str] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    argv, base = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    try:
        return run(parser().parse_args(argv), base)
    except AblateError as e:
        return exit_code_of(e, "ablate.tune")


if __name__ == "__main__":
    sys.exit(main())
