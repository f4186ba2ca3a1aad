"""Against a real Slurm on localhost (munge + slurmctld + slurmd + slurmdbd), started by the project's
own slurm/start_local.sh when it is not already up (.ci/run starts and stops it around the tests)."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import slurm_cluster
from conftest import REPO, cli_in_process, read_jsonl, run_cli, run_module
from planted import planted
from slurm_cluster import job_id, release_requeue_hold, story, submit_and_wait_for_metrics, wait_releasing_requeue_holds

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]   # one cluster: one worker
LOCAL_JOB = ["launcher=slurm", "launcher.nodes=1", "launcher.nproc_per_node=2", "launcher.gpus_per_node=0",
             "launcher.cpus_per_task=1", "launcher.mem_gb=2", "launcher.timeout_min=5", "parallel=ddp",
             "logger=none", "metrics.gemm_probe_n=128", "metrics.predict=false"]


@pytest.fixture(scope="module", autouse=True)
def local_slurm():
    """Use the one-node cluster if it is up (CI starts one); else start one here and stop it afterwards. Another
    Slurm on this host (not started by slurm/start_local.sh) is left alone: these tests skip."""
    slurm_cluster.leave_a_foreign_cluster_alone()
    started_here = False
    if slurm_cluster.nodes_up() != 1:
        failed = slurm_cluster.start(nodes=1)
        if failed:
            slurm_cluster.unavailable(f"no local Slurm could be started: {failed}")
        started_here = True
    yield
    if started_here:
        slurm_cluster.stop()


def test_a_two_task_ddp_job_trains_and_its_summary_comes_back(tmp_path, capsys, user_files):
    """With a user's config dir, model and optimizer (their module on PYTHONPATH, as on a cluster)."""
    result = cli_in_process(capsys, ["--config-dir", str(user_files.config_dir), "model=positional", "optim=rms",
                                     *LOCAL_JOB, "launcher.wait=true", "train.steps=8", f"hydra.run.dir={tmp_path}"],
                            env=user_files.env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "submitted Slurm job" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["comm_calls_per_step"] == 1
    assert summary["choices"]["model"] == "positional" and summary["optimizer"]["class"].endswith("RMSprop")
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")][-1] == 8


def test_a_two_point_sweep_runs_through_slurm(tmp_path):
    result = run_cli(["-m", *LOCAL_JOB, "launcher.wait=true", "train.steps=6", "train.seed=0,1",
                      f"hydra.sweep.dir={tmp_path}"], timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "submitted Slurm job array" in result.stdout and "2 tasks" in result.stdout   # one array, not two jobs
    summaries = sorted(tmp_path.glob("*/summary.json"))
    assert len(summaries) == 2
    losses = {json.loads(p.read_text())["loss"] for p in summaries}
    assert len(losses) == 2     # two seeds, two runs


def test_a_tune_on_slurm_is_one_allocation_whose_trials_are_job_steps(tmp_path):
    """#35: `python -m ablate.tune ... -- launcher=slurm ...`: one job (D/tune.sbatch), its driver the same
    command, each trial a job step of it; the lines stream here; the same command then submits nothing and
    writes the outputs again from D/optuna.db (~35 s on a quiet host)."""
    d = tmp_path / "D"
    args = ["--space", "dataloader=naive,pinned", "--trials", "2", "--dir", str(d), "--",
            *LOCAL_JOB, "train.steps=6", "train.warmup_steps=2", "train.log_every=2"]
    result = run_module("ablate.tune", args, timeout=400)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count("submitted Slurm job") == 1 and (d / "tune.sbatch").is_file()
    assert "trial 0:" in result.stdout and "trial 1:" in result.stdout      # the driver's lines, streamed here
    summaries = [json.loads(p.read_text()) for p in sorted(d.glob("trials/*/summary.json"))]
    assert len(summaries) == 2 and all(s["world_size"] == 2 for s in summaries)
    assert len({s["slurm"]["job_id"] for s in summaries}) == 1 and len({s["slurm"]["step_id"] for s in summaries}) == 2
    assert (d / "best.yaml").is_file() and (d / "tune.csv").read_text().count("complete") == 2
    again = run_module("ablate.tune", args, timeout=120)
    assert again.returncode == 0 and "submitted" not in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]
    assert "2 trial(s) already done" in again.stdout


def test_a_failing_job_shows_its_error_here(tmp_path, capsys):
    result = cli_in_process(capsys, [*LOCAL_JOB, "launcher.wait=true", "train.steps=20", f"hydra.run.dir={tmp_path}"],
                            env=planted(failure="0:3"))
    assert result.returncode == 1
    assert "injected failure on rank 0 at step 3" in result.stderr
    assert "failed" in result.stderr.splitlines()[-1]


def test_a_preempted_job_resumes_with_every_step_exactly_once(tmp_path):
    """The time-limit warning (USR2, what --signal sends before the limit) mid-run: checkpoint, requeue,
    resume, and each logged step exactly once."""
    steps = 60
    job, metrics, deadline = submit_and_wait_for_metrics(LOCAL_JOB, steps, tmp_path)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    summary = wait_releasing_requeue_holds(job, tmp_path, deadline + 240)
    steps_logged = [r["step"] for r in read_jsonl(metrics)]
    assert steps_logged == list(range(5, steps + 1, 5))
    assert 0 < summary["resumed_from_step"] < steps
    assert (tmp_path / "checkpoint/meta.pt").exists()


def test_sigterm_to_every_process_of_a_job_with_wandb_on_loses_nothing(tmp_path):
    """Slurm's SIGTERM reaches every process of the step, W&B's helper too: the run still checkpoints at
    the next step boundary, no W&B traceback, and the requeued job resumes with every step once."""
    steps = 40
    with_wandb = [a for a in LOCAL_JOB if a != "logger=none"] + ["logger=wandb"]
    job, metrics, deadline = submit_and_wait_for_metrics(with_wandb, steps, tmp_path)
    subprocess.run(["scancel", "--signal=TERM", job], check=True)   # to the step's processes, as preemption does
    while not (tmp_path / "checkpoint" / "meta.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert (tmp_path / "checkpoint" / "meta.pt").exists(), "no checkpoint after SIGTERM"
    requeues, last_requeue = 0, 0.0
    while not (tmp_path / "summary.json").exists() and time.monotonic() < deadline + 240:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
        if state == "PENDING":
            release_requeue_hold(job)
        elif not state and time.monotonic() - last_requeue > 5 and requeues < 5:
            # out of the queue: requeue it, as a preempting scheduler would. Slurm kills a restart that comes
            # within moments of the end ("Job credential revoked"), so let it settle and try again if needed
            time.sleep(2)
            subprocess.run(["scontrol", "requeue", job], capture_output=True)
            requeues, last_requeue = requeues + 1, time.monotonic()
        time.sleep(1)
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "slurm").rglob("*_log.*"))
    assert "Traceback" not in logs, logs[-3000:]
    assert (tmp_path / "summary.json").exists(), f"no summary after requeues\n{story(job, tmp_path)}"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["step"] for r in read_jsonl(metrics)] == list(range(5, steps + 1, 5))
    assert 0 < summary["resumed_from_step"] < steps


def test_scancel_term_ends_the_waiting_command_in_one_line_naming_the_checkpoint(tmp_path):
    """`scancel --signal=TERM` on a job the command waits for: the ranks checkpoint and leave (Slurm does not
    requeue a TERM), and the waiting command says so (exit 143) instead of calling it a failure."""
    proc = subprocess.Popen([sys.executable, "-m", "ablate", *LOCAL_JOB, "launcher.wait=true", "train.steps=200",
                             "train.log_every=5",
                             "dataloader.read_latency_ms=80", f"hydra.run.dir={tmp_path}"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WANDB_MODE": "offline"})
    job, deadline = job_id(tmp_path), time.monotonic() + 180
    while not ((tmp_path / "metrics.jsonl").exists() and read_jsonl(tmp_path / "metrics.jsonl")):
        assert time.monotonic() < deadline and proc.poll() is None, "the job never logged"
        time.sleep(0.3)
    subprocess.run(["scancel", "--signal=TERM", job], check=True)
    _, stderr = proc.communicate(timeout=180)
    last = stderr.strip().splitlines()[-1]
    assert proc.returncode == 143, stderr[-3000:]
    assert f"Slurm job {job} stopped" in last and "without an error; checkpoint at step" in last, last
    assert f"train.resume={tmp_path}" in last and "failed" not in last


def test_bad_slurm_input_is_refused_before_submitting(tmp_path, capsys):
    short = cli_in_process(capsys, ["launcher=slurm", "parallel=ddp", "launcher.timeout_min=1",
                                    f"hydra.run.dir={tmp_path}/a"])
    assert short.returncode == 2 and "launcher.signal_delay_s=90" in short.stderr
    no_ranks = cli_in_process(capsys, ["launcher=slurm", "parallel=none", f"hydra.run.dir={tmp_path}/b"])
    assert no_ranks.returncode == 2 and "parallel=none with 64 ranks" in no_ranks.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_hydras_own_submitit_launcher_also_works(tmp_path):
    """hydra-submitit-launcher 1.2.0: the sweep goes as one array job, each task runs the entrypoint,
    which finds Slurm's variables and joins the 2-task process group."""
    result = run_cli(["-m", "hydra/launcher=submitit_slurm", "hydra.launcher.tasks_per_node=2",
                      "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=5",
                      "parallel=ddp", "launcher.nproc_per_node=2", "logger=none", "train.steps=6",
                      "metrics.gemm_probe_n=128",
                      "metrics.predict=false", "train.seed=0,1", f"hydra.sweep.dir={tmp_path}"], timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json")]
    assert len(summaries) == 2 and all(s["world_size"] == 2 for s in summaries)


def test_a_request_no_node_can_hold_is_refused_before_submitting(tmp_path, capsys):
    """The default 8 CPUs per task, two tasks, on nodes with fewer CPUs (4 as .ci/run starts the cluster, 2 as
    the README's start_local.sh does here): one line, nothing submitted or left."""
    cpus = int(subprocess.run(["sinfo", "-h", "-N", "-o", "%c"], capture_output=True, text=True).stdout.split()[0])
    assert cpus < 16
    result = cli_in_process(capsys, ["launcher=slurm", "parallel=ddp", "launcher.nodes=1", "launcher.nproc_per_node=2",
                                     "launcher.gpus_per_node=0", f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "launcher.nproc_per_node=2 x launcher.cpus_per_task=8 = 16 CPUs per node" in result.stderr
    assert f"launcher.cpus_per_task<={cpus // 2}" in result.stderr and not (tmp_path / "run").exists()


def test_sbatch_refusing_the_job_is_one_line_and_leaves_no_run_dir(tmp_path, capsys):
    """Unchecked, a partition the cluster does not have reaches sbatch, which refuses it."""
    result = cli_in_process(capsys, ["launcher=slurm", "parallel=ddp", "launcher.check_cluster=false",
                                     "launcher.nodes=1", "launcher.nproc_per_node=2", "launcher.cpus_per_task=1",
                                     "launcher.gpus_per_node=0", "launcher.partition=nosuch",
                                     f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "sbatch refused the job: Batch job submission failed: Invalid partition name specified" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_job_that_can_never_start_ends_the_wait_and_is_cancelled(tmp_path, capsys):
    """Unchecked, 16 CPUs per node pend with Reason=PartitionConfig forever: the wait shows it and gives up."""
    result = cli_in_process(capsys, ["launcher=slurm", "parallel=ddp", "launcher.check_cluster=false",
                                     "launcher.nodes=1", "launcher.nproc_per_node=2", "launcher.gpus_per_node=0",
                                     "launcher.wait=true", f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode == 2, result.stderr
    assert "PENDING (PartitionConfig)" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "cannot start: PartitionConfig" in last and "cancelled it" in last
    job = last.split("Slurm job ")[1].split()[0]
    state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
    assert state in ("", "CANCELLED", "COMPLETING") and not (tmp_path / "run").exists()


def test_the_dry_runs_script_submitted_by_hand_trains(tmp_path, capsys, user_files, monkeypatch):
    """`launcher.dry_run=true`, typed in a directory with a config dir, a token file and a model module of the
    user's (`--config-dir conf`, `data.path=train.bin`, the module on PYTHONPATH), writes sbatch.sh; `sbatch` typed
    by someone else, from another directory with a bare PATH and no environment, trains 2 ranks."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copytree(user_files.config_dir, work / "conf")
    shutil.copy(user_files.tokens, work / "train.bin")
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    run_dir = tmp_path / "run"
    result = cli_in_process(capsys, ["--config-dir", "conf", "model=mine", "data=tokens", "data.path=train.bin",
                                     *LOCAL_JOB, "launcher.hardware=h100_sxm", "launcher.dry_run=true", "train.steps=6",
                                     f"hydra.run.dir={run_dir}"], env=user_files.env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"export PYTHONPATH={user_files.module_dir}" in (run_dir / "sbatch.sh").read_text()   # where it came from
    submitted = subprocess.run(["sbatch", "--parsable", str(run_dir / "sbatch.sh")], capture_output=True, text=True,
                               cwd=elsewhere, env={"PATH": "/usr/bin:/bin"})
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 240
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(1)
    log = (run_dir / "slurm" / f"{job}.err").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 6, log[-2000:]
    assert summary["choices"]["model"] == "mine" and summary["choices"]["data"] == "tokens"


def test_a_job_whose_python_has_no_cuda_is_refused_before_it_queues(tmp_path, capsys):
    """A submission (not a dry run) asking for a GPU from this CPU-only torch: one line naming the interpreter and
    launcher.python, nothing queued, no run dir (in process, ~1 s; the partition's own check left out: it has no
    GPU to offer)."""
    result = cli_in_process(capsys, [*LOCAL_JOB, "launcher.gpus_per_node=1", "launcher.check_cluster=false",
                                     f"hydra.run.dir={tmp_path}/run"])
    err = result.stderr.strip()
    assert result.returncode == 2 and err.splitlines() == [err], err
    assert f"({sys.executable}) has torch" in err and "launcher.python=PATH" in err
    assert not (tmp_path / "run").exists()
