"""launcher=slurm: the same entrypoint as a Slurm job through submitit (one task per GPU).

`submit` refuses what cannot work before submitting anything, writes the sbatch script for
`launcher.dry_run`, or submits `SlurmTrain` and prints the job id, log and W&B location; with
`launcher.wait` it streams the job's log and shows a failed job's error in this terminal.
Inside the job every task applies the allocator/NCCL environment, joins the process group from
Slurm's variables (submitit.helpers.TorchDistributedEnvironment) and trains. `SlurmTrain` is
checkpointable: on the warning signal the loop checkpoints at a step boundary and submitit requeues;
the requeued job resumes from <run dir>/checkpoint (train/checkpoint.py).
"""
from __future__ import annotations

import contextlib
import io
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import submitit
from submitit.helpers import Checkpointable

from ablate.config import AblateConfig, ConfigError, LauncherConfig, RunFailed, RunStopped
from ablate.launcher import cluster, environment, job_check, script
from ablate.launcher.failures import is_consequence
from ablate.logger import uses_wandb
from ablate.train import checkpoint, guards
from ablate.train import trainer as train


def check(lc: LauncherConfig) -> None:
    """One-line refusals before anything is submitted."""
    if lc.timeout_min * 60 <= lc.signal_delay_s:
        raise ConfigError(f"launcher.timeout_min={lc.timeout_min}: must be longer than launcher.signal_delay_s="
                          f"{lc.signal_delay_s} s (the warning signal comes that long before the limit)")
    if lc.dry_run:
        return
    if shutil.which("sbatch") is None:
        raise ConfigError("launcher=slurm: sbatch not found, Slurm is not installed here; start a local "
                          "cluster with slurm/start_local.sh, use launcher.dry_run=true, or launcher=local")
    cluster.check(lc)    # asks the controller (one line when it does not answer); check_cluster=false skips it


def export_lines(applied_env: Dict[str, Dict]) -> list:
    """The allocator/NCCL groups' variables as `export` lines: every task has them before Python starts."""
    lines = []
    for record in applied_env.values():
        lines += [f"export {k}={v}" for k, v in record.get("env", {}).items()]
    return lines


def executor_parameters(cfg: AblateConfig, name: str, applied_env: Dict) -> Dict[str, object]:
    lc = cfg.launcher
    params: Dict[str, object] = dict(
        nodes=lc.nodes, tasks_per_node=lc.nproc_per_node, cpus_per_task=lc.cpus_per_task,
        timeout_min=lc.timeout_min, name=name, slurm_signal_delay_s=lc.signal_delay_s,
        slurm_setup=list(lc.setup) + export_lines(applied_env),
        slurm_additional_parameters=dict(lc.additional_parameters))
    if lc.gpus_per_node:
        params["gpus_per_node"] = lc.gpus_per_node
    if lc.mem_gb:
        params["mem_gb"] = lc.mem_gb
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(lc, key):
            params[f"slurm_{key}"] = getattr(lc, key)
    return params


class ScriptOnlyExecutor(submitit.SlurmExecutor):
    """submitit's own Slurm executor for the dry run: it writes the script where Slurm is not installed
    (the real one refuses to start without srun)."""

    @classmethod
    def affinity(cls) -> int:
        return 2


def make_executor(cfg: AblateConfig, folder: Path, params: Dict[str, object]):
    if cfg.launcher.dry_run:   # generic names converted as AutoExecutor does; slurm_* passed through
        executor = ScriptOnlyExecutor(folder / "%j", max_num_timeout=cfg.launcher.max_restarts)
        generic = {k: v for k, v in params.items() if not k.startswith("slurm_")}
        specific = {k[len("slurm_"):]: v for k, v in params.items() if k.startswith("slurm_")}
        executor.update_parameters(**executor._convert_parameters(generic), **specific)
        return executor
    executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm",
                                     slurm_max_num_timeout=cfg.launcher.max_restarts)
    executor.update_parameters(**params)
    return executor


def sbatch_script(executor) -> str:
    """The script submitit would submit, made by submitit's own writer, without submitting it."""
    return executor._make_submission_file_text(executor._submitit_command_str, "dry-run")


class SlurmTrain(Checkpointable):
    """What each Slurm task runs. Checkpointable: submitit requeues it with the same arguments."""

    def __init__(self, cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str]):
        self.cfg, self.resolved, self.run_dir, self.choices = cfg, resolved, run_dir, choices

    def __call__(self) -> Optional[Dict]:
        applied = environment.apply(self.cfg)
        return train.run(self.cfg, self.run_dir, self.resolved, self.choices, applied)


def prepare(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str], applied: Dict):
    """(what each task runs, the executor's parameters) for this run. The request was checked against the
    cluster once, before anything started (compose.check_hardware -> launcher.check -> `check`)."""
    params = executor_parameters(cfg, f"ablate-{run_dir.name}", applied)
    return SlurmTrain(cfg, resolved, run_dir.resolve(), choices), params


def task_overrides() -> list:
    """The command line's overrides of this run (Hydra's record of them), with the config dirs it searched
    (`--config-dir`: Hydra keeps them as its own searchpath, which is not a task override): a job composing the
    command again finds the user's files."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    hydra = HydraConfig.get()
    users = [p for p in hydra.searchpath if str(p).startswith("file://")]
    searched = [f"hydra.searchpath=[{','.join(users)}]"] if users else []
    return [*searched, *hydra.overrides.task]


def submit(cfg: AblateConfig, resolved: Dict, run_dir: Path, choices: Dict[str, str],
           applied: Dict) -> Optional[Dict]:
    if cfg.launcher.dry_run:   # a script a user can submit as written (launcher/script.py)
        path = script.write(cfg, run_dir, applied, task_overrides())
        print(f"dry run: the sbatch script is {path} (nothing submitted; `sbatch {path}` runs it)")
        for note in job_check.notes(cfg):
            print(f"  note: {note}")
        return {"dry_run": str(path)}
    train, params = prepare(cfg, resolved, run_dir, choices, applied)
    folder = Path(cfg.launcher.folder or run_dir / "slurm").resolve()
    executor = make_executor(cfg, folder, params)
    job, = submit_jobs(executor, [train])
    print(f"submitted Slurm job {job.job_id}: log {job.paths.stdout}, run dir {run_dir}"
          + (f", W&B files under {run_dir}/wandb" if uses_wandb(cfg.logger) else ""), flush=True)
    if not cfg.launcher.wait:
        return {"job_id": job.job_id, "run_dir": str(run_dir)}
    return wait_for(job, cfg.launcher.cancel_unrunnable)


def submit_jobs(executor, trains: list) -> list:
    """Submit one job, or several as one job array (submitit's batch), each job knowing its run dir. sbatch
    refusing is one line, and the run dirs this call made are removed (nothing ran)."""
    try:   # submitit prints sbatch's stderr itself: keep it, the one line below says it
        with contextlib.redirect_stderr(io.StringIO()), executor.batch():
            jobs = [executor.submit(train) for train in trains]
    except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        error = lines[-1].replace("sbatch: error: ", "") if lines else type(e).__name__
        gone = [forget_run_dir(t.run_dir, t.cfg.train.resume) for t in trains]
        said = gone[0] if len(gone) == 1 else " (nothing ran; its run dirs removed)" if any(gone) else ""
        raise ConfigError(f"sbatch refused the job{' array' if len(trains) > 1 else ''}: {error}{said}") from None
    for job, pending in zip(jobs, trains):
        job.run_dir = pending.run_dir
    return jobs


def forget_run_dir(run_dir: Path, resume) -> str:
    """Nothing ran: remove the run dir this call made (its config, Hydra's files, submitit's folder), so a
    refused submission leaves nothing behind. A directory holding a run, or being resumed, is kept."""
    if resume or guards.holds_a_run(run_dir):
        return ""
    guards.release(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    return f" (nothing ran; {run_dir} removed)"


def wait_for(job, cancel_unrunnable: bool = True) -> Optional[Dict]:
    """Show the job's state while it waits, then stream its stderr (the progress lines) here until it
    ends; a failure ends this process. A pending reason that cannot clear ends the wait (cluster.py)."""
    shown, started, polls, left_queue = 0, time.monotonic(), 0, False
    watch = cluster.QueueWatch(job.job_id, sys.stderr, sys.stderr.isatty())
    # submitit asks Slurm about a job at most once a minute; once squeue no longer lists it, ask now
    while not job.done(force_check=left_queue):
        shown = cluster.show_new(job.paths.stderr, shown)
        state = cluster.queue_state(job.job_id) if polls % 2 == 0 else None   # squeue every 2 s, not every 1 s
        left_queue = polls % 2 == 0 and state is None and time.monotonic() - started > 2
        polls += 1
        if state:
            watch.update(state, time.monotonic() - started)
            if cluster.stuck(state):
                watch.end_line()
                give_up([job], state[1], cancel_unrunnable)
        time.sleep(1)
    watch.end_line()
    cluster.show_new(job.paths.stderr, shown, final=True)
    try:
        results = job.results()
    except Exception:   # submitit re-raises a task's own error with its traceback text
        rank, host, message = root_cause(job)
        state = _final_state(job)
        hint = _checkpoint_hint(getattr(job, "run_dir", None))
        stopped = (state or "").startswith(("COMPLETED", "CANCELLED", "PREEMPTED"))
        if message in (NO_ERROR, NO_REPORT) and hint and stopped:
            raise RunStopped(f"Slurm job {job.job_id} stopped{f' ({state})' if state else ''} without an error"
                             f"{hint}", exit_code=143) from None
        raise RunFailed(f"Slurm job {job.job_id} failed{f' ({state})' if state else ''}: rank {rank} on {host}: "
                        f"{message}{_checkpoint_hint(getattr(job, 'run_dir', None))}") from None
    return results[0]


NO_ERROR, NO_REPORT = "no task reported an error", "stopped before reporting an error"


def root_cause(job):
    """(rank, host, last line) of the task whose error is its own: a rank that only lost its peer (gloo's
    "Connection closed by peer") or left no result is a consequence of another rank's failure."""
    failures = []
    for rank in range(job.num_tasks):
        task = job.task(rank)
        error = task.exception()
        if error is None:
            continue
        if isinstance(error, submitit.core.utils.FailedJobError):   # the task's own traceback, between dashes
            trace = str(error).split("-" * 22)[1] if "-" * 22 in str(error) else str(error)
            message = _error_line(trace) or type(error).__name__
            failures.append((is_consequence(message), rank, _task_host(task), message))
        else:   # killed before it could report (srun stops a step's other tasks when one fails)
            failures.append((True, rank, _task_host(task), NO_REPORT))
    if not failures:
        return 0, "?", NO_ERROR
    _, rank, host, message = min(failures)
    return rank, host, message


def _error_line(trace: str) -> str:
    """The exception's own line of a traceback ("RuntimeError: ..."): not always the last line (a C++ error
    raised through pybind ends with its Python stack, "At: ...")."""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b:?", ln)]
    return (errors or lines or [""])[-1]


def _task_host(task) -> str:
    """The host a task ran on, from submitit's first log line ("Starting with JobEnvironment(... hostname=")."""
    try:
        text = Path(task.paths.stdout).read_text(errors="replace")
    except OSError:
        return "?"
    found = re.search(r"JobEnvironment\(.*?hostname=([^,)]+)", text)
    return found.group(1) if found else "?"


def give_up(jobs: list, reason: str, cancel: bool) -> None:
    """A job (or the waiting tasks of an array) that can never start: one line, and cancelled with its
    run dirs removed unless launcher.cancel_unrunnable=false."""
    name = f"job {jobs[0].job_id}" if len(jobs) == 1 else f"job array {jobs[0].job_id.split('_')[0]}"
    why = f"Slurm {name} cannot start: {reason}: {cluster.unrunnable(reason)}"
    if not cancel:
        raise RunFailed(f"{why}; it stays queued (launcher.cancel_unrunnable=false): scancel "
                        f"{jobs[0].job_id.split('_')[0]}")
    for job in jobs:
        job.cancel(check=False)
    gone = [forget_run_dir(job.run_dir, None) for job in jobs]
    said = gone[0] if len(gone) == 1 else f" (its {len(jobs)} waiting tasks)"
    raise ConfigError(f"{why}; cancelled it{said}")


def _final_state(job) -> Optional[str]:
    """Accounting lags a second or two behind the end of a job: ask again before naming its state (None
    while Slurm still says it runs)."""
    for _ in range(6):
        state = job.state
        if state not in ("RUNNING", "PENDING", "UNKNOWN", "COMPLETING"):
            return state
        time.sleep(0.5)
    return None


def _checkpoint_hint(run_dir) -> str:
    ckpt = Path(run_dir) / checkpoint.DIRNAME if run_dir else None
    if not ckpt or not (ckpt / "meta.pt").is_file():
        return ""
    step = checkpoint.read_meta(ckpt)["step"]
    return f"; checkpoint at step {step}: resume with train.resume={run_dir}"
