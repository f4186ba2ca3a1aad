"""The real local Slurm clusters the Slurm tests submit to (slurm/start_local.sh, one node or two), and
what those tests share: submitting a slow job, finding its id, waiting for it while releasing requeue holds."""
import json
import shutil
import subprocess
import time
from pathlib import Path

from conftest import REPO, read_jsonl, run_cli

SYSTEM_PATH = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


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
    return None if done.returncode == 0 else f"{done.stdout[-500:]}{done.stderr[-500:]}"


def unavailable(why: str):
    """No cluster: skipped on a developer's machine, a failure in CI (CI must run the Slurm tests)."""
    import os

    import pytest

    (pytest.fail if os.environ.get("CI") else pytest.skip)(why)


def stop():
    subprocess.run(["bash", str(REPO / "slurm" / "stop_local.sh")], env=SYSTEM_PATH, capture_output=True, timeout=180)


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
    """Submit a slow job without waiting, then wait until it has logged: (job id, metrics file, deadline)."""
    result = run_cli([*job_args, "launcher.wait=false", f"train.steps={steps}", "train.log_every=5",
                      "dataloader.read_latency_ms=80", f"hydra.run.dir={run_dir}"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    job = job_id(run_dir)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and read_jsonl(metrics)) and time.monotonic() < deadline:
        time.sleep(0.3)
    return job, metrics, deadline


def wait_releasing_requeue_holds(job: str, run_dir: Path, deadline: float) -> dict:
    """Wait for the run's summary; Slurm holds a requeued job ~2 min (BeginTime): release it at once."""
    while not (run_dir / "summary.json").exists() and time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
        if state == "PENDING":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
        time.sleep(1)
    return json.loads((run_dir / "summary.json").read_text())
