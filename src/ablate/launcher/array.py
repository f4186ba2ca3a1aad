"""launcher=slurm with -m: a sweep goes to Slurm as one job array, each point one array task with its
own run dir (Slurm's own way to queue many alike jobs: one submission, one `%` limit on how many run at
once, `launcher.array_parallelism`).

The sweep's launcher (hydra_plugins/ablate_launcher) runs each point's `python -m ablate ...` as usual:
it validates, writes the point's run dir and config, and `queue` stores what submitit would submit
instead of submitting it. `submit` then sends the points as arrays (points whose sbatch options differ,
e.g. a sweep over launcher.nodes or over the allocator's exported variables, go as one array each), or
writes the array's sbatch script for `launcher.dry_run`, and with `launcher.wait` waits for every task.
"""
from __future__ import annotations

import pickle
import sys
import time
from pathlib import Path
from typing import Dict, List

from ablate import units
from ablate.config import RunFailed, record
from ablate.launcher import cluster, slurm


def queue(path: Path, train: "slurm.SlurmTrain", params: Dict[str, object]) -> Dict[str, str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"train": train, "params": params}))
    print(f"queued for the sweep's job array: {train.run_dir}", flush=True)
    return {"queued": str(train.run_dir)}


def _groups(points: List[Dict]) -> List[List[Dict]]:
    """Points with the same sbatch options (all but the job name) share one array."""
    groups: Dict[str, List[Dict]] = {}
    for point in points:
        key = repr(sorted((k, v) for k, v in point["params"].items() if k != "name"))
        groups.setdefault(key, []).append(point)
    return list(groups.values())


def submit(paths: List[Path], sweep_dir: Path) -> None:
    points = [pickle.loads(p.read_bytes()) for p in paths]
    lc = points[0]["train"].cfg.launcher
    for n, group in enumerate(_groups(points)):
        params = {**group[0]["params"], "name": f"ablate-{sweep_dir.name}"}
        if lc.array_parallelism:
            params["slurm_array_parallelism"] = lc.array_parallelism
        executor = slurm.make_executor(group[0]["train"].cfg, (sweep_dir / "slurm").resolve(), params)
        if lc.dry_run:
            _write_script(executor, len(group), sweep_dir / f"sbatch_array{'' if n == 0 else f'_{n}'}.sh")
            continue
        jobs = _submit_group(executor, group)
        if lc.wait:
            wait_all(jobs, lc.cancel_unrunnable)


def _write_script(executor, count: int, path: Path) -> None:
    executor.parameters["map_count"] = count     # what submitit sets for an array: --array=0-(n-1)%limit
    path.write_text(slurm.sbatch_script(executor))
    print(f"dry run: the job array's sbatch script ({count} tasks) is {path} (nothing submitted)")


def _submit_group(executor, group: List[Dict]) -> list:
    jobs = slurm.submit_jobs(executor, [point["train"] for point in group])
    array_id = jobs[0].job_id.split("_")[0]
    limit = executor.parameters.get("array_parallelism", 256)
    print(f"submitted Slurm job array {array_id}: {len(jobs)} tasks, at most {min(limit, len(jobs))} at once; "
          f"logs under {jobs[0].paths.folder.parent}", flush=True)
    for job in jobs:
        print(f"  {job.job_id}: {job.run_dir}", flush=True)
    return jobs


def wait_all(jobs: list, cancel_unrunnable: bool) -> None:
    """One line per task as it ends; a pending reason that cannot clear cancels the array; a failed task
    is named with its root cause (rank, host, the rank's own error) and ends this process with 1."""
    left, failed, polls = list(jobs), [], 0
    while left:
        for job in [j for j in left if j.done()]:
            left.remove(job)
            error = job.exception()
            if error is None:
                print(f"[slurm] {job.job_id} done: {_figures(job.run_dir)}{job.run_dir}", file=sys.stderr, flush=True)
            else:
                rank, host, message = slurm.root_cause(job)
                failed.append(f"{job.job_id} ({job.run_dir}): rank {rank} on {host}: {message}")
                print(f"[slurm] {job.job_id} failed: {failed[-1]}", file=sys.stderr, flush=True)
        if left and polls % 5 == 0:
            state = cluster.queue_state(left[0].job_id)
            if cluster.stuck(state):
                slurm.give_up(left, state[1], cancel_unrunnable)
        polls += 1
        time.sleep(1)
    if failed:
        raise RunFailed(f"{len(failed)} of {len(jobs)} array tasks failed; first: {failed[0]}")


def _figures(run_dir: Path) -> str:
    """The figures a finished task's summary leads with, for its one line."""
    try:
        summary = record.load(Path(run_dir))
    except record.RecordError:
        return ""
    return "".join(f"{key} {units.fmt(key, summary.get(key))}, " for key in ("loss", "tokens_per_s", "mfu")
                   if summary.get(key) is not None)
