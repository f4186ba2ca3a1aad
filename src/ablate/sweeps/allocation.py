"""A sweep with launcher=slurm: ONE Slurm allocation for all its runs, each run a job step on its nodes.

`python -m ablate.sweeps NAME ... -- launcher=slurm ...`, typed outside a Slurm job, writes
D/sweep.sbatch (the nodes, tasks and GPUs of the sweep's largest run, for launcher.timeout_min) and
submits it. Inside, the same command is the sweep's driver (the batch shell itself) and runs each run as
`srun ... python -m ablate ...` (launcher/script.py `job_step`) in the planned order: A and B side by
side on the same nodes, one after the other, each with its timeout; the report is written inside the
job, into D. The driver's lines stream to the submitting terminal until the job ends (`--no-wait`:
submit and return). Each run's summary.json says where it ran: `slurm: {job_id, step_id, nodelist}`.
- Continues: a requeued allocation (preemption) or the same command again runs only what did not
  finish (runner.resume_point); when every run finished, nothing is submitted and the report is written.
- The time-limit warning (USR2 to the batch shell, launcher.signal_delay_s before the limit) is passed
  to the running step (its ranks checkpoint and stop), then the job is requeued: that run is redone.
- launcher.dry_run=true: the script is written, nothing submitted (`sbatch D/sweep.sbatch` runs it).
Typed inside an allocation already (salloc, a script of the user's), the runs are steps of that one.
`python -m ablate.tune ... -- launcher=slurm` takes the same path (`TUNE`): its trials are the job steps.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

from ablate import compose, launcher
from ablate.config import AblateConfig, ConfigError
from ablate.launcher import cluster, script
from ablate.train.ranks import rank_env

Combo = Tuple[str, ...]


class Driver(NamedTuple):
    """What the allocation runs, as its lines name it."""
    prog: str     # the command, in its one-line messages
    noun: str     # what it runs (also D/<noun>.sbatch)


SWEEP = Driver("ablate.sweeps", "sweep")
TUNE = Driver("ablate.tune", "tune")


def configs(runs) -> Dict[Combo, AblateConfig]:
    """Each distinct run's typed config (the plan's runs: (sweep, overrides, repeat))."""
    combos = list(dict.fromkeys(tuple(combo) for _, combo, _ in runs))
    return dict(zip(combos, compose.checked([list(c) for c in combos])))


def allocates(configs: Dict[Combo, AblateConfig]) -> bool:
    return any(launcher.JOB_STEP[c.launcher.name] for c in configs.values())


def inside() -> bool:
    """In a Slurm job already: the sweep's own allocation (its driver), or one the user holds."""
    return rank_env().slurm_job is not None


def largest(configs: Dict[Combo, AblateConfig]) -> AblateConfig:
    """The run the allocation must hold: most nodes, then tasks, CPUs and GPUs per node."""
    return max(configs.values(), key=lambda c: (c.launcher.nodes, c.launcher.nproc_per_node,
                                                c.launcher.cpus_per_task, c.launcher.gpus_per_node))


class Steps:
    """Inside the allocation: each run's `srun` prefix, and the time-limit warning passed on."""

    def __init__(self, configs: Dict[Combo, AblateConfig], what: Driver = SWEEP):
        self.configs, self.warned, self.job, self.what = configs, False, rank_env().slurm_job, what
        signal.signal(signal.SIGUSR2, self._warn)

    def prefix(self, combo: List[str], name: str) -> List[str]:
        lc = self.configs[tuple(combo)].launcher
        step = launcher.JOB_STEP[lc.name]
        return step(lc, name) if step else []

    def _warn(self, signum, frame) -> None:
        """The batch shell's warning: every step's tasks get it (not this shell: scancel without --full)."""
        self.warned = True
        subprocess.run(["scancel", "--signal=USR2", self.job], capture_output=True)

    def requeue_if_warned(self, title: str) -> None:
        """After the warning, before or after run `title`: requeue this job (this process ends with it: the
        driver is the job's batch shell, and leaves as Slurm requeues it; tried as a raised stop, the requeued
        job was lost from the queue in 2 of 3 runs of the two-node test, so it stays the exit it was)."""
        if not self.warned:
            return
        print(f"{title}: the time-limit warning came (a running run checkpoints and stops); Slurm job {self.job} "
              f"is requeued and its next attempt continues the {self.what.noun}, this run again", flush=True)
        subprocess.run(["scontrol", "requeue", self.job], capture_output=True)
        sys.exit(0)


def submit(root: Path, driver_args: List[str], configs: Dict[Combo, AblateConfig], wait: bool,
           what: Driver = SWEEP) -> int:
    """Write D/sweep.sbatch and submit it (or, on a dry run, only write it); with `wait`, follow it. The
    driver is the `python` that launcher.setup puts on the PATH, else this interpreter (a shared filesystem)."""
    cfg = largest(configs)
    driver = ["python" if cfg.launcher.setup else sys.executable, *driver_args]
    (root / "slurm").mkdir(parents=True, exist_ok=True)   # Slurm does not create its --output folder
    path = root / f"{what.noun}.sbatch"
    path.write_text(script.sweep_text(cfg, root, driver, *what))
    if cfg.launcher.dry_run:
        print(f"dry run: the {what.noun}'s sbatch script is {path} (nothing submitted; `sbatch {path}` runs the "
              f"whole {what.noun} in one allocation)")
        return 0
    done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if done.returncode:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()] or ["no reason given"]
        raise ConfigError(f"sbatch refused the {what.noun}'s job: {lines[-1].replace('sbatch: error: ', '')}")
    job = done.stdout.strip().split(";")[0]
    lc = cfg.launcher
    print(f"submitted Slurm job {job}: the whole {what.noun} in one allocation ({lc.nodes} node(s) x "
          f"{lc.nproc_per_node} task(s)), each run a job step; log {root / 'slurm' / f'{job}.out'}", flush=True)
    if not wait:
        print(f"not waiting (--no-wait): the report will be {root / 'report.md'}; scancel {job} stops the "
              f"{what.noun}, the same command continues it")
        return 0
    return follow(job, root, lc.cancel_unrunnable, what)


def live_job(root: Path) -> Optional[str]:
    """The Slurm job already running (or queued for) this sweep: one whose log is in D/slurm and that has
    not left its exit code, and that Slurm still lists. The same command follows it instead of submitting
    a second driver into the same D."""
    for log in sorted((root / "slurm").glob("*.out")):
        if log.stem.isdigit() and not log.with_suffix(".exit").exists() and cluster.queue_state(log.stem):
            return log.stem
    return None


def finish(root: Path, code: int) -> int:
    """The driver's exit code, left for the waiting terminal (the job's own state says less)."""
    if inside() and (root / "slurm").is_dir():
        (root / "slurm" / f"{rank_env().slurm_job}.exit").write_text(str(code))
    return code


GONE_AFTER_POLLS = 10   # squeue not listing the job this many times in a row (1 s apart): it has ended (one
# failed squeue, a busy controller, must not end the wait while the job runs)


def follow(job: str, root: Path, cancel_unrunnable: bool, what: Driver = SWEEP) -> int:
    """The job's state while it waits, then the driver's lines here until it ends (requeues included); the
    driver's exit code. Ctrl-C stops the waiting, not the sweep."""
    logs = {root / "slurm" / f"{job}.out": sys.stdout, root / "slurm" / f"{job}.err": sys.stderr}
    shown = dict.fromkeys(logs, 0)
    exit_file, started, missing = root / "slurm" / f"{job}.exit", time.monotonic(), 0
    watch = cluster.QueueWatch(job, sys.stderr, sys.stderr.isatty())
    try:
        while not exit_file.exists() and missing < GONE_AFTER_POLLS:
            for log, stream in logs.items():
                shown[log] = cluster.show_new(log, shown[log], stream=stream, prefix="")
            state = cluster.queue_state(job)
            missing = 0 if state else missing + 1
            if state and state[0] != "RUNNING":
                watch.update(state, time.monotonic() - started)
            if cluster.stuck(state):
                watch.end_line()
                return _give_up(job, state[1], cancel_unrunnable, what)
            time.sleep(1)
    except KeyboardInterrupt:
        watch.end_line()
        print(f"\n{what.prog}: stopped waiting; the {what.noun} goes on in Slurm job {job} (scancel {job} stops "
              f"it; the same command follows it again, or reports it when it is done)", file=sys.stderr)
        return 130
    watch.end_line()
    for log, stream in logs.items():
        cluster.show_new(log, shown[log], final=True, stream=stream, prefix="")
    if exit_file.exists():
        return int(exit_file.read_text().strip() or 1)
    print(f"{what.prog}: Slurm job {job} ended before its {what.noun} did (cancelled or killed); the same "
          f"command continues it (finished runs are kept)", file=sys.stderr)
    return 1


def _give_up(job: str, reason: str, cancel: bool, what: Driver) -> int:
    why = f"Slurm job {job} cannot start: {reason}: {cluster.unrunnable(reason)}"
    if not cancel:
        print(f"{what.prog}: {why}; it stays queued (launcher.cancel_unrunnable=false): scancel {job}",
              file=sys.stderr)
        return 1
    subprocess.run(["scancel", job], capture_output=True)
    raise ConfigError(f"{why}; cancelled it")
