"""The real local Slurm clusters the Slurm tests submit to (slurm/start_local.sh, one node or two), and
what those tests share: submitting a slow job, finding its id, waiting for it while releasing requeue holds."""
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict

import submitit

from conftest import REPO, read_jsonl, run_cli

SYSTEM_PATH = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


MARK = "# written by ablate's slurm/start_local.sh"   # slurm/start_local.sh's first line of the slurm.conf it writes


def foreign() -> str:
    """Why the Slurm on this host is not the suite's own ("" when it is ours, or none runs): a slurm.conf that
    slurm/start_local.sh did not write, or its daemons running without our pid files. The suite never submits to,
    restarts or stops such a cluster: its Slurm tests skip (one line)."""
    conf = Path("/etc/slurm/slurm.conf")
    if conf.is_file() and conf.stat().st_size and not conf.read_text(errors="replace").startswith(MARK):
        return f"another Slurm is set up on this host ({conf} was not written by slurm/start_local.sh)"
    base = os.environ.get("SLURM_CI_ROOT", "/tmp/slurm-ci")   # (start_local.sh's default)
    ours = {p.read_text().strip() for root in (base, f"{base}-2nodes") for p in Path(root).glob("run/*.pid")}
    for daemon in ("slurmctld", "slurmd"):
        pids = subprocess.run(["pgrep", "-x", daemon], capture_output=True, text=True).stdout.split()
        stranger = [p for p in pids if p not in ours]
        if stranger:
            return f"another Slurm runs on this host ({daemon} pid {stranger[0]}, not started by slurm/start_local.sh)"
    return ""


def leave_a_foreign_cluster_alone() -> None:
    """Skip the module's tests, in one line, when the Slurm on this host is not the suite's own."""
    import pytest

    why = foreign()
    if why:
        pytest.skip(f"Slurm tests skipped: {why}; the suite leaves it alone")


def nodes_up() -> int:
    """How many nodes the running local cluster has (0: none answers)."""
    if shutil.which("sinfo") is None:
        return 0
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True)
    return len(set(out.stdout.split())) if out.returncode == 0 else 0


def start(nodes: int):
    """Start the local cluster with this many nodes (stopping the other kind): None, or why it failed."""
    done = subprocess.run(["bash", str(REPO / "slurm" / "start_local.sh"), "--nodes", str(nodes)],
                          env={"SLURM_CI_CPUS": "4", **SYSTEM_PATH}, capture_output=True, text=True, timeout=600)
    forget_the_other_clusters_jobs()
    return None if done.returncode == 0 else f"{done.stdout[-500:]}{done.stderr[-500:]}"


def unavailable(why: str):
    """No cluster: skipped on a developer's machine, a failure in CI (CI must run the Slurm tests)."""
    import pytest

    (pytest.fail if os.environ.get("CI") else pytest.skip)(why)


def stop():
    subprocess.run(["bash", str(REPO / "slurm" / "stop_local.sh")], env=SYSTEM_PATH, capture_output=True, timeout=180)
    forget_the_other_clusters_jobs()


def forget_the_other_clusters_jobs() -> None:
    """A test process that ran jobs in process on one cluster starts its next ones as a fresh process would.
    submitit keeps one watcher per process (a class attribute) that caches the final state of every job id it
    has seen; the two local clusters number their jobs each in its own sequence, so the other cluster's job N,
    finished, made this cluster's job N "done" at once: `Slurm job 17 failed (FAILED): rank 0 on ?: no task
    reported an error` for a job whose four tasks all succeeded (results() waits 15 s for a task's result)."""
    submitit.SlurmJob.watcher.clear()


def job_id(run_dir: Path, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # the job's own folder (submitit's %j), not its submission pickle, whose random hex name can start
        # with a digit too (seen: "5415...d5678.pkl" taken for a job id, and scancel refused it)
        ids = [p.name for p in (run_dir / "slurm").glob("[0-9]*") if p.is_dir() and p.name.isdigit()]
        if ids:
            return ids[0]
        time.sleep(0.2)
    raise AssertionError("no job folder")


def submit_and_wait_for_metrics(job_args, steps: int, run_dir: Path):
    """Submit a slow job without waiting, then wait until it has logged: (job id, metrics file, deadline).
    A job that never logs fails here, with its story, rather than being signalled before its handlers are in."""
    result = run_cli([*job_args, "launcher.wait=false", f"train.steps={steps}", "train.log_every=5",
                      "dataloader.read_latency_ms=80", f"hydra.run.dir={run_dir}"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    job = job_id(run_dir)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and read_jsonl(metrics)) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert metrics.exists() and read_jsonl(metrics), f"job {job} logged nothing in 120 s\n{story(job, run_dir)}"
    return job, metrics, deadline


PENDING_SINCE: Dict[str, float] = {}
# Slurm's credentials are stamped in whole seconds: a requeued job started again within the second its previous
# attempt's credential was revoked is killed as "Job credential revoked" (exit 1, nothing logged; a loaded host's
# CI met it). Slurm's own ~2 min BeginTime avoids it; the tests wait this long instead.
REQUEUE_SETTLE_S = 3.0


def release_requeue_hold(job: str) -> None:
    """Slurm holds a requeued job ~2 min (BeginTime), and holds one whose launch failed: release it once it has
    been pending REQUEUE_SETTLE_S."""
    state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
    if state != "PENDING":
        PENDING_SINCE.pop(job, None)
        return
    if time.monotonic() - PENDING_SINCE.setdefault(job, time.monotonic()) >= REQUEUE_SETTLE_S:
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
        subprocess.run(["scontrol", "release", job], capture_output=True)


def wait_releasing_requeue_holds(job: str, run_dir: Path, deadline: float) -> dict:
    """Wait for the run's summary, releasing the requeued job's holds; no summary in time: the job's story."""
    while not (run_dir / "summary.json").exists() and time.monotonic() < deadline:
        release_requeue_hold(job)
        time.sleep(1)
    assert (run_dir / "summary.json").exists(), f"job {job} wrote no summary in time\n{story(job, run_dir)}"
    return json.loads((run_dir / "summary.json").read_text())


def story(job: str, run_dir: Path) -> str:
    """What a failed Slurm test needs to be understood after the cluster is gone (CI purges it): the job's
    record, the nodes' states and reasons (a node drained by a step it could not kill), the tasks' last lines."""
    asked = [["scontrol", "show", "job", job], ["sinfo", "-N", "-o", "%N %T %E"],
             ["sacct", "-j", job, "-X", "-n", "-D", "-o", "JobID,State,ExitCode,Reason%40,NodeList"]]
    parts = [f"$ {' '.join(a)}\n{_output(a)}" for a in asked]
    for log in sorted(p for p in (run_dir / "slurm").glob("**/*") if p.suffix in (".out", ".err")):
        parts.append(f"--- {log.relative_to(run_dir)} (last lines)\n" + "\n".join(log.read_text().splitlines()[-15:]))
    return "\n".join(parts)


def _output(command: list) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
        return (done.stdout + done.stderr).strip()[-2000:]
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({e})"
