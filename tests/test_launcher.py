"""launcher=slurm without a cluster: the dry run's script, and the refusal when Slurm is missing (each command's
main() in process, ~1 s: a dry run trains nothing; the README types one as a process)."""
import os
import shutil
import signal
import sys
import threading

from torch.distributed.launcher.api import LaunchConfig

from ablate.launcher.local import run_agent
from conftest import USER_DIR, main_in_process


def test_dry_run_writes_the_8_by_8_by_8_script(tmp_path, monkeypatch, capsys):
    assert main_in_process(monkeypatch, ["launcher=slurm", "launcher.dry_run=true", "parallel=zero3", "nccl=tuned",
                                         "allocator=expandable", f"hydra.run.dir={tmp_path}"]) == 0
    result = capsys.readouterr()
    script = (tmp_path / "sbatch.sh").read_text()
    for line in ("#SBATCH --nodes=8", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --signal=USR2@90", "export NCCL_ALGO=RING",
                 "export PYTORCH_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128"):
        assert line in script
    assert str(tmp_path / "sbatch.sh") in result.out
    assert list((tmp_path / "slurm").iterdir()) == []   # nothing submitted; its log folder made, for Slurm
    # a script a user can submit as written: logs where Slurm can write, requeue, the profile's python
    assert f"#SBATCH --output={tmp_path}/slurm/%j.out" in script and "#SBATCH --requeue" in script
    assert "srun --unbuffered python -u -m ablate " in script and sys.executable not in script
    assert "parallel=zero3" in script and f"hydra.run.dir={tmp_path}" in script
    assert "launcher.dry_run=false" in script and 'RESUME=train.resume=' in script


def test_a_dry_run_sweep_writes_one_job_array_script(tmp_path, monkeypatch):
    """Each point is prepared by its own `python -m ablate` (no training): two points, ~10 s."""
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main_in_process(monkeypatch, ["-m", "launcher=slurm", "launcher.dry_run=true", "parallel=ddp",
                                         "train.seed=0,1", "launcher.array_parallelism=1",
                                         f"hydra.sweep.dir={tmp_path}"]) == 0
    script = (tmp_path / "sbatch_array.sh").read_text()
    assert "#SBATCH --array=0-1%1" in script and "#SBATCH --nodes=8" in script
    assert "%A_%a" in script                                  # each task its own log folder
    assert len(list(tmp_path.glob("*/config.yaml"))) == 2     # and its own run dir
    assert not (tmp_path / "slurm").exists()                  # nothing submitted


def test_a_dry_run_of_ablate_sweeps_writes_one_allocation_for_the_whole_sweep(tmp_path, monkeypatch, capsys):
    """`ablate.sweeps ... launcher=slurm launcher.dry_run=true`: D/sweep.sbatch holds the largest run's nodes,
    its driver is the same command (the runs become its job steps), nothing is submitted (no Slurm here)."""
    from ablate.sweeps.__main__ import main as sweeps_main

    sweep = tmp_path / "D"
    monkeypatch.setenv("PATH", "/nonexistent")
    assert sweeps_main(["c3_no_sync", "--repeats", "2", "--dir", str(sweep), "--", "logger=none", "launcher=slurm",
                        "launcher.dry_run=true", "launcher.nodes=2"]) == 0
    result = capsys.readouterr()
    script = (sweep / "sweep.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --signal=B:USR2@90", "#SBATCH --requeue",
                 f"#SBATCH --output={sweep}/slurm/%j.out"):
        assert line in script
    driver = script.splitlines()[-1]
    assert driver.startswith(f"exec {sys.executable} -u -m ablate.sweeps c3_no_sync --repeats=2 ")
    assert f"--dir={sweep}" in driver and driver.endswith("launcher.nodes=2")
    assert "sweep.sbatch" in result.out and "nothing submitted" in result.out
    assert (sweep / "plan.json").exists() and list((sweep / "slurm").iterdir()) == []
    assert not list(sweep.glob("*/*/config.yaml"))     # no run started


def test_slurm_missing_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main_in_process(monkeypatch, ["launcher=slurm", "parallel=ddp", f"hydra.run.dir={tmp_path}/run"]) == 2
    result = capsys.readouterr()
    assert result.err.strip().splitlines() == [result.err.strip()]
    assert "sbatch not found" in result.err and not (tmp_path / "run").exists()


def test_the_dry_run_needs_no_slurm_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main_in_process(monkeypatch, ["launcher=slurm", "launcher.dry_run=true", "parallel=ddp",
                                         f"hydra.run.dir={tmp_path}"]) == 0
    assert "#SBATCH --nodes=8" in (tmp_path / "sbatch.sh").read_text()


# ------------------------------------------------------------------ scale on paper: Slurm's variables -> ranks
SLURM_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _rank_env(monkeypatch, nodelist, nodes, per_node, node, local, job_id="4242"):
    """What every task of an sbatch job with --nodes=N --ntasks-per-node=T sees (Slurm's own variables),
    turned into torch's by the code each task runs (ranks.export_slurm_env)."""
    import os

    from ablate.train import distributed, ranks

    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)   # as under a plain srun
    for key in SLURM_VARS + ("GROUP_RANK",):
        monkeypatch.delenv(key, raising=False)
    for key, value in {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": nodes,
                       "SLURM_NTASKS": nodes * per_node, "SLURM_NTASKS_PER_NODE": per_node, "SLURM_NODEID": node,
                       "SLURM_LOCALID": local, "SLURM_PROCID": node * per_node + local}.items():
        monkeypatch.setenv(key, str(value))
    ranks.export_slurm_env()
    os.environ.pop("SUBMITIT_EXECUTOR", None)   # set by the export (see there): leave no trace for other tests
    env = {k: os.environ[k] for k in SLURM_VARS}
    place = distributed.place(distributed.DistEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])))
    for key in SLURM_VARS:   # set by the export, not by monkeypatch: pop them (delenv would put them back)
        os.environ.pop(key)
    return env, place


def test_every_rank_of_the_8_by_8_job_gets_its_place(monkeypatch):
    seen = set()
    for node in range(8):
        for local in range(8):
            env, place = _rank_env(monkeypatch, "gpu[001-008]", 8, 8, node, local)
            assert env["RANK"] == str(node * 8 + local) and env["LOCAL_RANK"] == str(local)
            assert env["WORLD_SIZE"] == "64" and env["LOCAL_WORLD_SIZE"] == "8"
            assert env["MASTER_ADDR"] == "gpu001"
            assert place["node_rank"] == node
            seen.add((env["RANK"], env["MASTER_PORT"]))
    assert len(seen) == 64 and len({port for _, port in seen}) == 1   # one rendezvous port for all 64
    last, _ = _rank_env(monkeypatch, "gpu[001-008]", 8, 8, 7, 7)      # rank 63 on node 8
    assert (last["RANK"], last["LOCAL_RANK"], last["WORLD_SIZE"]) == ("63", "7", "64")


def test_rank_1023_of_a_128_by_8_job_over_two_node_ranges(monkeypatch):
    env, place = _rank_env(monkeypatch, "a[0001-0064],b[0001-0064]", 128, 8, 127, 7)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("1023", "7", "1024")
    assert env["MASTER_ADDR"] == "a0001" and place["node_rank"] == 127
    first, _ = _rank_env(monkeypatch, "a[0001-0064],b[0001-0064]", 128, 8, 0, 0)
    assert first["MASTER_PORT"] == env["MASTER_PORT"]


def test_layout_lists_hosts_in_node_order():
    from ablate.train.distributed import layout

    places = [{"rank": r, "host": f"n{r // 2 + 1}", "node_rank": r // 2, "local_rank": r % 2} for r in (3, 0, 2, 1)]
    assert layout(places) == {"hosts": ["n1", "n2"], "nodes": 2, "ranks_by_host": {"n1": [0, 1], "n2": [2, 3]}}


# ------------------------------------------------------------------ the cluster check (cluster.py), on real text
PARTITIONS = (
    "PartitionName=debug Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=node[1-2] State=UP TotalNodes=2\n"
    "PartitionName=gpu Default=NO MaxNodes=4 MaxTime=1-00:00:00 Nodes=g[1-8] State=UP TotalNodes=8\n")


def _launcher(**kw):
    from ablate.config import LauncherConfig

    return LauncherConfig(name="slurm", **kw)


def test_slurm_times_and_gres_are_read_as_slurm_writes_them():
    from ablate.launcher.cluster import gpu_count, slurm_minutes

    assert [slurm_minutes(t) for t in ("UNLIMITED", "30", "30:00", "04:00:00", "1-00:00:00", "2-12:30:01")] == \
        [None, 30, 30, 240, 1440, 3631]
    assert [gpu_count(g) for g in ("(null)", "gpu:8", "gpu:h100:8(S:0-1)", "gpu:a100:4,gpu:v100:2")] == [0, 8, 8, 6]


def test_requests_the_partition_can_never_run_are_named():
    from ablate.launcher.cluster import parse_nodes, parse_partitions, refusal

    parts = parse_partitions(PARTITIONS)
    debug, gpu = parts["debug"], parts["gpu"]
    assert debug.default and gpu.max_nodes == 4 and gpu.max_time_min == 1440
    debug.nodes = parse_nodes("node1|2|10847|(null)\nnode2|2|10847|(null)\n")
    gpu.nodes = parse_nodes("".join(f"g{i}|96|2000000+|gpu:h100:8(S:0-1)\n" for i in range(1, 9)))
    fits = dict(nodes=2, nproc_per_node=1, cpus_per_task=1, gpus_per_node=0, mem_gb=None)
    assert refusal(_launcher(**fits), debug) is None
    cpus = refusal(_launcher(**{**fits, "nodes": 1, "nproc_per_node": 2, "cpus_per_task": 8}), debug)
    assert cpus.startswith("launcher.nproc_per_node=2 x launcher.cpus_per_task=8 = 16 CPUs per node") and \
        "at most 2 CPUs; use launcher.cpus_per_task<=1" in cpus
    assert "has 2 node(s); use launcher.nodes<=2" in refusal(_launcher(**{**fits, "nodes": 8}), debug)
    assert "no GPUs (no gpu gres)" in refusal(_launcher(**{**fits, "gpus_per_node": 8}), debug)
    assert "at most 10 GB" in refusal(_launcher(**{**fits, "mem_gb": 64}), debug)
    assert refusal(_launcher(nodes=4, nproc_per_node=8, cpus_per_task=8, gpus_per_node=8), gpu) is None
    assert "at most 4 node(s) per job (MaxNodes)" in refusal(_launcher(nodes=8, nproc_per_node=8, gpus_per_node=8), gpu)
    long = refusal(_launcher(nodes=4, gpus_per_node=8, timeout_min=2000), gpu)
    assert long.startswith("launcher.timeout_min=2000") and "MaxTime=1-00:00:00" in long
    every = refusal(_launcher(**{**fits, "cpus_per_task": 8, "gpus_per_node": 8, "mem_gb": 64}), debug)
    assert [p.split(":")[0] for p in every.split("; and ")] == [   # every problem at once, each with its fix
        "launcher.nproc_per_node=1 x launcher.cpus_per_task=8 = 8 CPUs per node, but the nodes of partition 'debug' "
        "have at most 2 CPUs; use launcher.cpus_per_task<=2", "launcher.gpus_per_node=8", "launcher.mem_gb=64"]


def test_waiting_shows_state_changes_once_in_a_log_and_on_one_line_in_a_terminal():
    import io

    from ablate.launcher.cluster import QueueWatch, unrunnable

    log = io.StringIO()
    watch = QueueWatch("7", log, tty=False)
    for state in [("PENDING", "Priority"), ("PENDING", "Priority"), ("PENDING", "Resources"), ("RUNNING", "None")]:
        watch.update(state, 3.0)
    assert log.getvalue().splitlines() == ["[slurm] job 7: PENDING (Priority)", "[slurm] job 7: PENDING (Resources)",
                                           "[slurm] job 7: RUNNING"]
    term = io.StringIO()
    watch = QueueWatch("7", term, tty=True)
    watch.update(("PENDING", "Priority"), 1.0)
    watch.update(("PENDING", "Priority"), 3.0)
    watch.update(("RUNNING", "None"), 4.0)
    text = term.getvalue()
    assert text.count("\r") == 2 and "waiting 3 s" in text and text.endswith("\n[slurm] job 7: RUNNING\n")
    assert unrunnable("ReqNodeNotAvail, UnavailableNodes:node2") and unrunnable("PartitionConfig")
    assert unrunnable("Resources") is None and unrunnable("Priority") is None and unrunnable("BeginTime") is None


def test_a_rank_that_only_lost_its_peer_is_never_named_the_root_cause():
    """Rank 0's gloo error ends with its captured stack; the peer-loss words are in its first line. Rank 1
    raised its own error. Rank 1 is the root cause whatever the order, and rank 0's line is its message."""
    from types import SimpleNamespace

    from ablate.launcher.failures import own_error, root_cause_first

    lost = SimpleNamespace(exitcode=1, timestamp=100, message={"message": (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:538] Connection closed by peer "
        "[127.0.0.1]:4242\nException raised from recvAsync at pair.cc:1\nframe #0: c10::Error::Error\n"
        "  .venv/lib/python3.11/site-packages/torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py(31): "
        "<lambda>"), "extraInfo": {"py_callstack": ""}})
    own = SimpleNamespace(exitcode=1, timestamp=101, message={"message": "RuntimeError: injected failure on rank "
                                                                         "1 at step 3", "extraInfo": {}})
    assert own_error(lost).startswith("RuntimeError: [../third_party/gloo") and "Connection closed" in own_error(lost)
    assert [rank for rank, _ in root_cause_first({0: lost, 1: own})] == [1, 0]
    # seen once in CI: rank 1 was killed before its error file was written, rank 0 blames "a remote worker
    # crashing": the killed rank is nearer the cause than the one that blames it
    blames = SimpleNamespace(exitcode=1, timestamp=100, message={"message": (
        "RuntimeError: Got the following error when running the callback: ... typically caused by a remote "
        "worker crashing. Check the logs of the remote worker"), "extraInfo": {}})
    killed = SimpleNamespace(exitcode=-15, timestamp=101, message="Signal 15 (SIGTERM) received by PID 7")
    assert [rank for rank, _ in root_cause_first({0: blames, 1: killed})] == [1, 0]


def test_each_rank_runs_on_the_cpus_it_was_given(monkeypatch):
    """OpenMP threads per rank (in process, no torch): a user's OMP_NUM_THREADS stands; an srun task keeps to
    SLURM_CPUS_PER_TASK even where the affinity mask shows the whole host (task/none); ranks forked by our
    launcher share their process's CPUs, or the one Slurm task's."""
    from ablate.train.ranks import cpu_threads_per_rank

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    local = {"RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
    assert cpu_threads_per_rank(local) == 4                                   # 8 cores, 2 local ranks
    assert cpu_threads_per_rank({**local, "OMP_NUM_THREADS": "3"}) == 3
    srun_task = {"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS_PER_NODE": "1",
                 "SLURM_CPUS_PER_TASK": "1"}
    assert cpu_threads_per_rank(srun_task) == 1                               # not the host's 8
    assert cpu_threads_per_rank({**srun_task, "SLURM_CPUS_PER_TASK": "6"}) == 6
    assert cpu_threads_per_rank({**local, "SLURM_STEP_ID": "0", "SLURM_CPUS_PER_TASK": "6"}) == 3   # one task, 2 ranks
    assert cpu_threads_per_rank({**local, "LOCAL_WORLD_SIZE": "16"}) == 1     # never 0
    monkeypatch.delattr("os.sched_getaffinity")                               # macOS: the host's cores
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert cpu_threads_per_rank(local) == 3


def test_a_slurm_jobs_rendezvous_port_is_one_the_kernel_never_hands_out(monkeypatch):
    """In process: every task of a job gets the same port, below the ephemeral range (where submitit's pick,
    20000-60000, found its port taken by a local connection in CI); neighbouring jobs get different ones; a
    MASTER_PORT the user set stands."""
    import os
    from pathlib import Path

    from ablate.train import ranks

    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low, high = (int(x) for x in ephemeral.read_text().split()) if ephemeral.exists() else (32768, 60999)
    ports = {ranks.slurm_master_port(str(job)) for job in range(10**6, 10**6 + 5000)}
    assert len(ports) == 5000 and all(1024 < p < low or p > high for p in ports)
    job = {"SLURM_JOB_ID": "123456", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0",
           "SLURM_NTASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "vm",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_NODELIST": "vm"}
    exported = ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                "SUBMITIT_EXECUTOR")

    def in_a_fresh_task():
        for name in exported:           # (set, then removed: monkeypatch takes whatever export sets back)
            monkeypatch.setenv(name, "")
            monkeypatch.delenv(name)

    for name, value in job.items():
        monkeypatch.setenv(name, value)
    in_a_fresh_task()
    ranks.export_slurm_env()
    assert os.environ["MASTER_PORT"] == str(ranks.slurm_master_port("123456")) and os.environ["RANK"] == "1"
    in_a_fresh_task()
    monkeypatch.setenv("MASTER_PORT", "29512")
    ranks.export_slurm_env()
    assert os.environ["MASTER_PORT"] == "29512" and os.environ["WORLD_SIZE"] == "2"


# ------------------------------------------------------------------ the job checked before it queues (dry runs)
ONE_GPU_JOB = ["launcher=slurm", "launcher.dry_run=true", "launcher.nodes=1", "launcher.nproc_per_node=1",
               "launcher.gpus_per_node=1", "parallel=none", "logger=none"]


def test_a_job_whose_peak_does_not_fit_its_gpu_is_refused_with_what_would(tmp_path, monkeypatch, capsys):
    """In process, model=small on a GPU file of 10 GiB (its planned peak 13 GB, 8.6 GB with selective
    checkpointing): one line with the overshoot and the best single change that fits, no run dir (~5 s); with
    launcher.allow_unfit=true the script is written."""
    gpu = tmp_path / "gpu10.yaml"
    gpu.write_text("name: gpu10\ndevice_names: [GPU10]\nmemory_gib: 10\npeak_tflops: {bf16: 100, fp32: 10}\n")
    small = ["model=small", "train.batch_size=8", "train.seq_len=1024", "model.max_seq_len=1024",
             f"launcher.hardware={gpu}"]
    capsys.readouterr()
    assert main_in_process(monkeypatch, [*ONE_GPU_JOB, *small, f"hydra.run.dir={tmp_path}/run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and not (tmp_path / "run").exists()
    assert "launcher.hardware=gpu10: the planned peak per GPU is" in err and "GB over its 10.7 GB" in err
    assert "what would fit: model.activation_checkpointing=selective" in err and "launcher.allow_unfit=true" in err
    assert main_in_process(monkeypatch, [*ONE_GPU_JOB, *small, "launcher.allow_unfit=true",
                                         f"hydra.run.dir={tmp_path}/run"]) == 0
    assert (tmp_path / "run" / "sbatch.sh").exists()


def test_a_dry_run_says_what_the_jobs_python_lacks_and_what_it_left_unchecked(tmp_path, monkeypatch, capsys):
    """In process (~1 s): this CPU-only torch asked for a GPU, and no launcher.hardware: two notes beside the path."""
    capsys.readouterr()
    assert main_in_process(monkeypatch, [*ONE_GPU_JOB, f"hydra.run.dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    notes = [ln for ln in out.splitlines() if ln.startswith("  note: ")]
    assert len(notes) == 2 and "sbatch.sh" in out
    assert f"the job's Python ({sys.executable}) has torch" in notes[0] and "built without CUDA" in notes[0]
    assert "launcher.python=PATH" in notes[0] and "launcher.hardware=NAME" in notes[1]


def test_a_job_whose_model_cannot_be_imported_is_refused_before_its_script_is_written(tmp_path, monkeypatch, capsys):
    capsys.readouterr()
    assert main_in_process(monkeypatch, ["--config-dir", str(USER_DIR / "conf"), "model=mine",
                                         "model._target_=nosuchmod.GPT", *ONE_GPU_JOB,
                                         f"hydra.run.dir={tmp_path}/run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "model._target_=nosuchmod.GPT: cannot import it" in err
    assert not (tmp_path / "run").exists()


def test_the_scripts_pythonpath_is_where_the_module_came_from_whichever_dir_writes_it(tmp_path, monkeypatch):
    """Written from two directories, the module importable through PYTHONPATH alone (in process, ~2 s): both scripts
    put the module's directory on PYTHONPATH, and neither the directory it was written from."""
    monkeypatch.setenv("PYTHONPATH", str(USER_DIR))
    monkeypatch.syspath_prepend(str(USER_DIR))
    lines = []
    for here in ("a", "b"):
        (tmp_path / here).mkdir()
        monkeypatch.chdir(tmp_path / here)
        assert main_in_process(monkeypatch, ["--config-dir", str(USER_DIR / "conf"), "model=mine", *ONE_GPU_JOB,
                                             f"hydra.run.dir={tmp_path}/{here}/run"]) == 0
        script = (tmp_path / here / "run" / "sbatch.sh").read_text()
        lines.append(next(ln for ln in script.splitlines() if ln.startswith("export PYTHONPATH=")))
    assert lines[0] == lines[1] == f"export PYTHONPATH={USER_DIR}" + "${PYTHONPATH:+:$PYTHONPATH}"


def test_a_job_that_names_a_python_without_ablate_is_refused(tmp_path, monkeypatch, capsys):
    """launcher.python: that interpreter asked in the script's own environment (a subprocess, ~1 s)."""
    bare = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.base_prefix + "/bin/python3"
    capsys.readouterr()
    assert main_in_process(monkeypatch, [*ONE_GPU_JOB, f"launcher.python={bare}",
                                         f"hydra.run.dir={tmp_path}/run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and f"the job's Python ({bare}) cannot run ablate" in err
    assert "No module named 'ablate'" in err and not (tmp_path / "run").exists()


def test_several_nodes_with_the_local_launcher_are_refused_before_any_rank(tmp_path, monkeypatch, capsys):
    capsys.readouterr()
    assert main_in_process(monkeypatch, ["launcher.nodes=2", "parallel=ddp", f"hydra.run.dir={tmp_path}/run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "launcher.nodes=2 with launcher=local: this launcher runs one node" in err
    assert "use launcher=slurm" in err and not (tmp_path / "run").exists()


def test_an_agent_stopped_by_a_signal_leaves_no_thread_to_abort_the_exit():
    """torch's agent, stopped by a signal, keeps its rendezvous open with a daemon keep-alive thread; one in a
    store call as the interpreter ends aborts it (exit -6 where the user's SIGTERM should give 143). The rank
    here signals its agent, this process (a real c10d rendezvous and spawned rank; ~5 s)."""
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id="signalled", rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.1, start_method="spawn")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        results, stopped_by = run_agent(config, os.kill, os.getpid(), signal.SIGTERM)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)   # the agent's, for its ranks
    assert results is None and stopped_by == signal.SIGTERM
    assert [t.name for t in threading.enumerate() if t.name.startswith("RendezvousKeepAlive")] == []
