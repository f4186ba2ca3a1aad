"""On a real two-node Slurm (slurm/start_local.sh --nodes 2: two slurmd, each in its own network and UTS
namespace, so node1 and node2 are different hosts with their own IP): rendezvous, training, checkpoints,
preemption, failures and sweeps across hosts. The module switches the machine to the two-node cluster and
back to what ran before (the one-node cluster in CI)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import slurm_cluster
from conftest import AS_TYPED_IN_A_TERMINAL, REPO, cli_in_process, read_jsonl, run_cli, run_module
from planted import planted

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]   # one cluster: one worker
TWO_NODES = ["launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=1", "launcher.gpus_per_node=0",
             "launcher.cpus_per_task=1", "launcher.mem_gb=2", "launcher.timeout_min=5", "logger=none",
             "metrics.gemm_probe_n=128", "metrics.predict=false"]
SHORT = ["train.steps=6", "train.warmup_steps=2", "train.log_every=2"]


@pytest.fixture(scope="module", autouse=True)
def two_node_slurm():
    slurm_cluster.leave_a_foreign_cluster_alone()   # another Slurm on this host: never switched, these tests skip
    before = slurm_cluster.nodes_up()
    if before != 2:
        failed = slurm_cluster.start(nodes=2)
        if failed:
            slurm_cluster.unavailable(f"the two-node local Slurm could not be started: {failed}")
    yield
    if before == 1:
        slurm_cluster.start(nodes=1)
    elif before == 0:
        slurm_cluster.stop()


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """The reference: one process, two micro-steps, the same global batch as two ranks of one micro-step."""
    run_dir = tmp_path_factory.mktemp("single")
    result = run_cli(["logger=none", "metrics.gemm_probe_n=128", "metrics.predict=false", *SHORT, "train.grad_accum=2",
                      f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stderr[-3000:]
    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")]


# hsdp on 2 nodes x 1 rank: one shard group per node (shard_size = the node's 1 rank), replicated across the nodes
MESH = {"ddp": {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "tp": 1},
        "hsdp": {"pp": 1, "dp_replicate": 2, "dp_shard": 1, "tp": 1},
        "zero3": {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1}}


@pytest.mark.parametrize("parallel", ["ddp", "hsdp", "zero3"])
def test_two_nodes_train_one_rank_each_and_match_one_process(tmp_path, single_process, parallel, capsys):
    result = cli_in_process(capsys, [*TWO_NODES, f"parallel={parallel}", *SHORT, "launcher.wait=true",
                                     f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["hosts"] == ["node1", "node2"] and summary["ranks_by_host"] == {"node1": [0], "node2": [1]}
    assert summary["mesh"] == MESH[parallel] and summary["comm_bytes_by_dim"][
        "dp_replicate" if MESH[parallel]["dp_replicate"] == 2 else "dp_shard"] > 0
    assert [(r["host"], r["node_rank"], r["local_rank"]) for r in summary["per_rank"]] == [("node1", 0, 0),
                                                                                          ("node2", 1, 0)]
    losses = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
    assert losses == pytest.approx(single_process, abs=2e-4), (losses, single_process)
    # only rank 0 writes the run's files: each step logged once, one summary, no per-rank copies
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [2, 4, 6]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == \
        ["ablate.log", "config.yaml", "metrics.jsonl", "slurm", "summary.json"]


def test_a_pipeline_puts_a_stage_on_each_node(tmp_path, capsys):
    """parallel.pp=2 on 2 nodes x 1 rank: the embedding and block 0 on node1, block 1 and the head on node2; the
    activations and gradients cross the hosts on the pp dim (+25 s)."""
    result = cli_in_process(capsys, [*TWO_NODES, "parallel.pp=2", *SHORT, "launcher.wait=true",
                                     f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ranks_by_host"] == {"node1": [0], "node2": [1]}
    assert summary["mesh"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 1}
    assert summary["comm_bytes_by_dim"]["pp"] > 0 and summary["pipeline"]["schedule"] == "1f1b"
    assert all(0 <= r["pp_bubble"] < 1 for r in summary["per_rank"])


def test_a_preempted_two_node_job_resumes_with_every_step_exactly_once(tmp_path):
    steps = 60
    job, metrics, deadline = slurm_cluster.submit_and_wait_for_metrics([*TWO_NODES, "parallel=ddp"], steps, tmp_path)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    summary = slurm_cluster.wait_releasing_requeue_holds(job, tmp_path, deadline + 240)
    assert [r["step"] for r in read_jsonl(metrics)] == list(range(5, steps + 1, 5))
    assert 0 < summary["resumed_from_step"] < steps and summary["hosts"] == ["node1", "node2"]


def test_a_failure_on_node2_ends_the_job_and_shows_node2s_error_here(tmp_path, capsys):
    started = time.monotonic()
    result = cli_in_process(capsys, [*TWO_NODES, "parallel=ddp", "launcher.wait=true", "train.steps=200",
                                     "train.log_every=5", "dataloader.read_latency_ms=20", f"hydra.run.dir={tmp_path}"],
                            env=planted(failure="1:3"))
    took = time.monotonic() - started
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "injected failure on rank 1 at step 3" in last and "node2" in last, result.stderr[-3000:]
    assert took < 90, took     # 200 steps at 20 ms of reads each would take far longer


def test_a_two_point_sweep_runs_each_point_on_two_nodes(tmp_path):
    result = run_cli(["-m", *TWO_NODES, "parallel=ddp", *SHORT, "launcher.wait=true", "train.seed=0,1",
                      f"hydra.sweep.dir={tmp_path}"], timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "submitted Slurm job array" in result.stdout
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/summary.json"))]
    assert len(summaries) == 2 and all(s["hosts"] == ["node1", "node2"] for s in summaries)
    assert len({s["loss"] for s in summaries}) == 2


def test_two_nodes_by_two_ranks_lay_the_ranks_out_node_by_node(tmp_path, capsys):
    """2 x 2 on nodes that advertise 4 CPUs (SLURM_CI_CPUS): ranks 0,1 on node1 and 2,3 on node2, each
    node's local ranks 0 and 1. Four ranks of one micro-step = the reference's batch x2, so no loss check."""
    result = cli_in_process(capsys, [*TWO_NODES, "launcher.nproc_per_node=2", "parallel=ddp", *SHORT,
                                     "launcher.wait=true", f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["ranks_by_host"] == {"node1": [0, 1], "node2": [2, 3]}
    assert [(r["host"], r["node_rank"], r["local_rank"]) for r in summary["per_rank"]] == [
        ("node1", 0, 0), ("node1", 0, 1), ("node2", 1, 0), ("node2", 1, 1)]


def test_a_sweep_on_slurm_is_one_allocation_that_survives_its_time_limit_warning_and_runs_nothing_twice(tmp_path):
    """#24, one allocation for both stories (~2 min quiet; they were two tests of 6 and 7 min): `python -m
    ablate.sweeps c3_no_sync --dir D -- launcher=slurm launcher.nodes=2 ...` is one job whose 2 runs are job
    steps, each on both nodes (one run per arm: the requeue story needs no interval; with --repeats 2 it was 4
    runs, 380-492 s of the Slurm worker in CI). USR2 to its batch shell (what `--signal=B:USR2@T` sends before
    the limit): the driver passes it to the running step (its ranks checkpoint and stop) and requeues the job.
    Ctrl-C while the command waits stops the waiting, not the sweep; the same call then follows that job (no
    second one) to its report, the stopped run set aside and run again; once every run finished, the same call
    runs nothing."""
    sweep, said = tmp_path / "D", tmp_path / "first.txt"
    args = ["c3_no_sync", "--dir", str(sweep), "--", *TWO_NODES, "launcher.timeout_min=15",
            "train.steps=40", "train.log_every=5", "dataloader.read_latency_ms=10"]
    with open(said, "w") as out:
        first = subprocess.Popen([sys.executable, "-m", "ablate.sweeps", *args], cwd=REPO, stdout=out,
                                 stderr=subprocess.STDOUT, text=True, **AS_TYPED_IN_A_TERMINAL,
                                 env={**os.environ, "WANDB_MODE": "offline"})
    deadline = time.monotonic() + 240
    while not [p for p in sweep.glob("c3_no_sync/*/metrics.jsonl") if read_jsonl(p)]:   # a run is mid-way
        assert time.monotonic() < deadline and first.poll() is None, said.read_text()[-3000:]
        time.sleep(0.3)
    job = next((sweep / "slurm").glob("*.out")).stem
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True)
    while "the time-limit warning came" not in said.read_text():   # the driver's line, streamed here
        assert time.monotonic() < deadline + 120 and first.poll() is None, said.read_text()[-3000:]
        time.sleep(0.3)
    os.killpg(first.pid, signal.SIGINT)                  # Ctrl-C in the terminal
    assert first.wait(timeout=30) == 130 and "stopped waiting; the sweep goes on in Slurm job" in said.read_text()
    with open(tmp_path / "second.txt", "w") as second:
        again = subprocess.Popen([sys.executable, "-m", "ablate.sweeps", *args], cwd=REPO, text=True, stdout=second,
                                 stderr=subprocess.STDOUT, env={**os.environ, "WANDB_MODE": "offline"})
    while again.poll() is None:   # following the requeued job, held ~2 min by Slurm unless released
        assert time.monotonic() < deadline + 720, f"the sweep did not end\n{slurm_cluster.story(job, sweep)}"
        slurm_cluster.release_requeue_hold(job)
        time.sleep(1)
    out = (tmp_path / "second.txt").read_text()
    assert again.returncode == 0, out[-3000:]
    assert "already runs this sweep: following it" in out and "submitted" not in out
    assert "[2/2] c3_no_sync" in out and (sweep / "report.csv").exists(), out[-3000:]
    stopped = list(sweep.glob("c3_no_sync/*.incomplete-1"))
    assert len(stopped) == 1 and (stopped[0] / "checkpoint").is_dir()    # it checkpointed on the warning
    summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("c3_no_sync/*/summary.json"))]
    assert len(summaries) == 2 and {s["slurm"]["job_id"] for s in summaries} == {job}
    assert len({s["slurm"]["step_id"] for s in summaries}) == 2   # each run a job step (of the second attempt)
    assert all(s["hosts"] == ["node1", "node2"] and s["slurm"]["nodelist"] == "node[1-2]" for s in summaries)
    third = run_module("ablate.sweeps", args, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "submitted" not in third.stdout and third.stdout.count("finished in an earlier call: kept") == 2

