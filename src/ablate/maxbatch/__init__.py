"""`python -m ablate.maxbatch [options] -- OVERRIDES`: the largest per-rank batch that fits (week-4 C5's
"batch x4": expandable segments let a larger batch fit where the default allocator fragments).

The batch doubles from `--start` until a trial does not fit, then bisects between the last fit and the
first miss, in steps of `--multiple-of`. Each trial is a few real steps of the configured workload
(`python -m ablate OVERRIDES train.batch_size=B ...`) in a fresh process, so no trial inherits another's
CUDA cache or allocator. A trial does not fit when it runs out of memory (CUDA OOM, the memory preflight,
the kernel's OOM killer) or when its measured peak is above `--mem-budget-gb`: on CUDA the peak reserved
by the caching allocator, on a CPU the process's peak RSS. A CPU budget is not the CUDA allocator (no
fragmentation, no expandable segments): the search is the same, what it says about C5 is not.

Writes `summary.json` (max_batch, the budget and what measured it, every trial), `metrics.jsonl` (one row
per trial) and `config.yaml` to the run dir (`hydra.run.dir` among OVERRIDES, else runs/maxbatch/<time>),
and to W&B like any run (`logger=`).
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from ablate import units
from ablate.config import AblateError, ConfigError, RunStopped, exit_code_of
from ablate.config import arguments as cli
from ablate.config.command_line import config_dir_override
from ablate.launcher import group

SET_PER_TRIAL = ("train.batch_size", "train.global_batch_size", "train.steps", "train.warmup_steps",
                 "train.checkpoint_every", "metrics.gemm_probe", "metrics.predict", "logger", "hydra.run.dir",
                 "train.resume")
CPU_NOTE = ("a CPU budget is the process's peak RSS (runtime + model state + activations), not the CUDA "
            "caching allocator: fragmentation and expandable segments do not apply")


class Stopped(Exception):
    """SIGTERM or Ctrl-C during the search: the trial running is stopped, what was found is kept."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stoppable() -> Iterator[None]:
    """SIGTERM and SIGINT raise Stopped in the search (the trial's own process group is then killed)."""
    def stop(signum, frame):
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def search(fits: Callable[[int], bool], start: int, limit: int, multiple: int) -> Optional[int]:
    """The largest multiple of `multiple` in [start, limit] for which `fits` holds, assuming that what fits
    at B fits below B: doubling until a miss, then bisection. None when even `start` does not fit."""
    largest, smallest_miss, batch = None, None, start
    while batch <= limit:
        if not fits(batch):
            smallest_miss = batch
            break
        largest, batch = batch, batch * 2
    if largest is None:
        return None
    upper = smallest_miss if smallest_miss is not None else limit + multiple
    while upper - largest > multiple:
        middle = (largest + upper) // 2 // multiple * multiple
        if middle <= largest:
            break
        if fits(middle):
            largest = middle
        else:
            upper = middle
    return largest


class Trials:
    """Runs one trial per batch size in a fresh process and judges it against the budget."""

    def __init__(self, overrides: List[str], run_dir: Path, budget: Optional[int], steps: int, cuda: bool):
        self.overrides = [o for o in overrides if o.lstrip("+~").split("=")[0] not in SET_PER_TRIAL]
        self.run_dir, self.budget, self.steps, self.cuda = run_dir, budget, steps, cuda
        self.figure = "mem_reserved_bytes" if cuda else "mem_peak_bytes"
        self.log: List[Dict[str, object]] = []

    def overrides_at(self, batch: int) -> List[str]:
        command = [*self.overrides, f"train.batch_size={batch}",
                   "train.global_batch_size=null", f"train.steps={self.steps}", "train.warmup_steps=1",
                   "train.checkpoint_every=0", "metrics.gemm_probe=false", "logger=none",
                   "metrics.predict=false"]   # a trial probes memory: its speed is nobody's figure
        if self.cuda:   # CUDA's own OOM decides: ablate's static estimate is one figure for both allocators
            command.append("train.skip_memory_check=true")
        return command

    def planned_miss(self, batch: int) -> Optional[str]:
        """Why the plan already says the batch cannot fit the budget (its planned peak per rank, without the GPU
        allowance: a lower bound), or None: no trial is run for such a batch."""
        if self.budget is None:
            return None
        from ablate.compose import config_of
        from ablate.train.memory_guard import over_budget

        what = over_budget(config_of(self.overrides_at(batch))[1], self.budget)
        return f"planned, not run: {what} over the {units.fmt('bytes', self.budget)} budget" if what else None

    def __call__(self, batch: int) -> bool:
        trial_dir = self.run_dir / "max_batch_trials" / f"batch_{batch:05d}"
        command = self.overrides_at(batch)
        started = time.monotonic()
        miss = self.planned_miss(batch)
        if miss:
            judged = {"fits": False, "why": miss}
        else:   # a stop (Stopped, below) kills the trial's whole group
            done, found = group.run_ablate(command, trial_dir, keep_stdout=True)
            judged = self._judge(done, trial_dir, found)
        row = {"trial": len(self.log) + 1, "batch_size": batch, "seconds": round(time.monotonic() - started, 2),
               **judged}
        self.log.append(row)
        peak = f", peak {units.fmt('bytes', row['peak_bytes'])}" if row.get("peak_bytes") else ""
        print(f"trial {row['trial']}: batch {batch}: {'fits' if row['fits'] else 'does not fit'} "
              f"({row['why']}{peak}, {row['seconds']:.1f} s)", flush=True)
        return bool(row["fits"])

    def _judge(self, done: subprocess.CompletedProcess, trial_dir: Path, found) -> Dict[str, object]:
        if done.returncode != 0:
            if group.out_of_memory(done):
                return {"fits": False, "why": "out of memory" if done.returncode not in (-9, 137) else "killed (OOM)"}
            lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
            raise ConfigError(f"trial in {trial_dir} failed for a reason other than memory: "
                              f"{lines[-1] if lines else f'exit code {done.returncode}'}")
        peak = found.figure(self.figure)
        if self.budget is None:
            return {"fits": True, "why": "ran", "peak_bytes": peak}
        fits = peak is not None and peak <= self.budget
        return {"fits": fits, "why": f"{'within' if fits else 'over'} the {units.fmt('bytes', self.budget)} budget",
                "peak_bytes": peak}


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ablate.maxbatch", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mem-budget-gb", type=cli.positive, default=None,
                        help="fit = measured peak within this budget (default: CUDA OOM decides; on a CPU, half "
                             "the memory available now)")
    parser.add_argument("--start", type=cli.count, default=None, help="first batch (default: --multiple-of)")
    parser.add_argument("--limit", type=cli.count, default=4096, help="largest batch tried (default 4096)")
    parser.add_argument("--multiple-of", type=cli.count, default=1, help="search batches in these steps (default 1)")
    parser.add_argument("--steps", type=cli.count, default=4, help="optimizer steps per trial (default 4)")
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR", type=cli.in_dir,
                        help="a config dir of your own "
                        "(model/, optim/, ... files), for the workload and every trial")
    parser.add_argument("overrides", nargs="*", help="as for python -m ablate (after --)")
    args = parser.parse_args(argv)
    for key in ("limit", "multiple_of", "steps"):
        if getattr(args, key) < (2 if key == "steps" else 1):
            parser.error(f"--{key.replace('_', '-')}={getattr(args, key)}: must be at least "
                         f"{2 if key == 'steps' else 1}")
    args.start = args.start or args.multiple_of
    if args.start > args.limit:
        parser.error(f"--start={args.start}: above --limit={args.limit}; nothing to search")
    if args.start % args.multiple_of:
        parser.error(f"--start={args.start}: must be a multiple of --multiple-of={args.multiple_of}")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m ablate.maxbatch` (maxbatch/__main__.py exits with what it returns): 0, or an error's exit code
    after its one line."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        args.overrides = [*config_dir_override(args.config_dir), *args.overrides]
        run(args)
    except AblateError as e:
        return exit_code_of(e, "ablate.maxbatch")
    return 0


def compose(overrides: List[str]):
    """The workload's typed config, resolved dict and group choices, validated as `python -m ablate` does."""
    from omegaconf import OmegaConf

    from ablate.compose import config_of, preflight

    preflight([*overrides, "train.skip_memory_check=true"], hardware=False)   # one-line errors, no traceback
    cfg, typed, choices = config_of([o for o in overrides if not o.startswith("hydra.") or
                                     o.startswith("hydra.searchpath=")])
    resolved = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    return typed, resolved, choices


def on_cuda(cfg) -> bool:
    from ablate.train.distributed import device_type

    return device_type(cfg.train.device) == "cuda"


def budget(gb: Optional[float], cuda: bool):
    """(bytes or None, how a trial is judged)."""
    if gb is not None:
        figure = "peak CUDA memory reserved" if cuda else "peak RSS"
        return int(gb * 1e9), f"{figure} within {units.fmt('bytes', int(gb * 1e9))} (--mem-budget-gb)"
    if cuda:
        return None, "no CUDA out-of-memory error"
    from ablate.train.memory_guard import available_cpu_bytes

    half = int(available_cpu_bytes() // 2)
    return half, f"peak RSS within {units.fmt('bytes', half)} (half the memory available now; --mem-budget-gb sets it)"


def run(args: argparse.Namespace) -> Dict[str, object]:
    cfg, resolved, choices = compose(args.overrides)
    given = [o.split("=", 1)[1] for o in args.overrides if o.startswith("hydra.run.dir=")]
    run_dir = Path(given[-1] if given else f"runs/maxbatch/{datetime.now():%Y-%m-%d_%H-%M-%S}")
    cuda = on_cuda(cfg)
    limit, rule = budget(args.mem_budget_gb, cuda)
    print(f"largest batch: doubling from {args.start}, then bisecting in steps of {args.multiple_of} (at most "
          f"{args.limit}); fits = {rule}; run dir {run_dir}", flush=True)
    trials = Trials(args.overrides, run_dir, limit, args.steps, cuda)
    stopped = None
    try:
        with stoppable():
            found = search(trials, args.start, args.limit, args.multiple_of)
    except Stopped as e:   # what the finished trials say is kept: the largest that fitted is a lower bound
        stopped, found = e, None
    summary = {"max_batch": found, "limit_reached": found is not None and found * 2 > args.limit,
               "budget_bytes": limit, "fit_rule": rule, "device": "cuda" if cuda else "cpu",
               "figure": trials.figure, "trials": trials.log, "choices": choices, "overrides": args.overrides,
               "search": {"start": args.start, "limit": args.limit, "multiple_of": args.multiple_of,
                          "steps": args.steps},
               "notes": {} if cuda else {"max_batch": CPU_NOTE}}
    if stopped is not None:
        fitted = [row["batch_size"] for row in trials.log if row["fits"]]
        summary.update(stopped=str(stopped), largest_fit_so_far=max(fitted, default=None))
        summary["notes"]["max_batch"] = f"not found: stopped by {stopped} after {len(trials.log)} trials"
    _write(summary, cfg, resolved, choices, run_dir)
    if stopped is not None:
        raise RunStopped(f"stopped by {stopped} after {len(trials.log)} trials (largest that fitted: "
                         f"{summary['largest_fit_so_far']}); partial record in {run_dir / 'summary.json'}",
                         exit_code=128 + stopped.signum)
    return summary


def _write(summary: Dict[str, object], cfg, resolved: Dict, choices: Dict[str, str], run_dir: Path) -> None:
    """summary.json, metrics.jsonl (a row per trial), config.yaml and W&B, as for any run."""
    import yaml

    from ablate.logger import Tracker

    run_dir.mkdir(parents=True, exist_ok=True)   # (no trial made it when the plan ruled every batch out)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    tracker = Tracker(cfg.logger, run_dir, resolved, choices, is_main=True)
    for row in summary["trials"]:
        tracker.log({k: v for k, v in row.items() if k != "why"})
    tracker.finish(summary, kind="max_batch")
    found = summary["max_batch"]
    if "stopped" in summary:
        return
    print(f"max_batch: {found if found is not None else 'none (even the first batch does not fit)'}"
          f"{' (the --limit; more may fit)' if summary['limit_reached'] else ''} after {len(summary['trials'])} "
          f"trials; {run_dir / 'summary.json'}" + (f"\nnote: {CPU_NOTE}" if summary["device"] == "cpu" else ""))

