"""When things go wrong, nothing recorded is lost and nothing hangs: real processes, real signals,
the real wandb library (its helper process really killed), real mounts for read-only and full disks."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ablate import units
from ablate.train import checkpoint, guards, manifest
from conftest import AS_TYPED_IN_A_TERMINAL, REPO, launch_in_process, main_in_process, read_jsonl, run_cli
from planted import planted

FAST = ["logger=none", "train.warmup_steps=1", "train.log_every=2", "metrics.gemm_probe_n=64", "metrics.predict=false"]


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    return lines[0]


def test_an_empty_run_dir_and_a_locked_one_are_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for empty in ("hydra.run.dir=", "hydra.run.dir=''", 'hydra.run.dir=""'):   # in process, ~0.1 s each
        assert main_in_process(monkeypatch, [empty]) == 2
        assert "hydra.run.dir is empty" in capsys.readouterr().err
    for key in ("hydra.run.dir", "hydra.sweep.dir"):   # a folder name no filesystem takes
        assert main_in_process(monkeypatch, ["-m" if "sweep" in key else "logger=none", f"{key}=runs/{'x' * 300}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{key}: a name of 300 bytes" in err[0], err
    assert not list(tmp_path.iterdir())       # nothing written into the current directory
    guards.lock(tmp_path / "busy")            # another live run holds this directory
    try:
        locked = run_cli([*FAST, "train.steps=3", f"hydra.run.dir={tmp_path / 'busy'}"])
    finally:
        guards.release(tmp_path / "busy")
    assert locked.returncode == 2 and "another run is writing into it" in one_line(locked)
    assert not (tmp_path / "busy" / "metrics.jsonl").exists()


def test_a_model_that_cannot_fit_is_refused_before_allocating(tmp_path, monkeypatch, capsys):   # in process, ~1 s
    assert main_in_process(monkeypatch, ["model=8b", f"hydra.run.dir={tmp_path}/run"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("ablate: error: model=8b: needs about")
    assert "GB planned peak (ablate.plan, at " in line and "train.skip_memory_check=true" in line
    assert not (tmp_path / "run").exists()


def test_the_memory_check_reads_the_cgroups_above_the_process_v1_and_v2(tmp_path):   # in process, ~0 s
    """A copy of /proc/self/cgroup and of the cgroup mounts: a v1 memory group of 3 GiB (1 GiB in use) nested in one
    without a limit, and a v2 group of 8 GiB: the tightest, v1's, is the room."""
    from ablate.train.memory_guard import cgroup_dirs, memory_room

    own = tmp_path / "cgroup"
    own.write_text("4:memory:/jobs/mine\n3:cpuset:/\n0::/user.slice\n")
    v1, v2 = tmp_path / "memory" / "jobs" / "mine", tmp_path / "user.slice"
    for group, limit, used, files in ((v1, 3 << 30, 1 << 30, ("memory.limit_in_bytes", "memory.usage_in_bytes")),
                                      (v1.parent, 9223372036854771712, 2 << 30, ("memory.limit_in_bytes",
                                                                                 "memory.usage_in_bytes")),
                                      (v2, 8 << 30, 0, ("memory.max", "memory.current")),
                                      (tmp_path, "max", 0, ("memory.max", "memory.current"))):
        group.mkdir(parents=True, exist_ok=True)
        (group / files[0]).write_text(f"{limit}\n")
        (group / files[1]).write_text(f"{used}\n")
    room, said = memory_room(list(cgroup_dirs(own, tmp_path)))
    assert room == 2 << 30 and f"its memory cgroup ({v1}: 3.2 GB, 1.1 GB in use) leaves" == said


@pytest.mark.slow   # a process of its own (its limit must not be this worker's)
def test_ulimit_v_is_a_memory_limit_too(tmp_path):
    """`ulimit -v 4000000` (4 GB of address space a process), then model=1b: refused in one line (~4 s)."""
    import resource

    limit = 4_000_000 * 1024
    done = subprocess.run([sys.executable, "-m", "ablate", "model=1b", "logger=none", f"hydra.run.dir={tmp_path}/r"],
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert done.returncode == 2 and "ulimit -v leaves each process" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "r").exists()


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                                 capture_output=True).returncode == 0


def test_read_only_and_full_run_dirs_are_one_line(tmp_path, monkeypatch, capsys):
    """In process, refused before training, ~1 s."""
    ro, full = tmp_path / "ro", tmp_path / "full"
    if not _mount_tmpfs(ro, "ro,size=1m"):
        pytest.skip("needs root and tmpfs mounts to make a read-only and a full filesystem")
    try:
        assert _mount_tmpfs(full, "size=64k")
        (full / "filler").write_bytes(b"\0" * (64 * 1024 - 4096))    # leaves less than the 1 MB ablate wants
        for where, needle in ((ro, "is not writable"), (full, "no space left")):
            assert main_in_process(monkeypatch, [*FAST, f"hydra.run.dir={where}/run"]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and needle in err[0], err
        from ablate.tune.__main__ import main as tune_main  # a tune's --dir: the disk's problem, not another tune's
        for where, needle in ((ro, "cannot be written (Read-only file system)"), (full, "no space left")):
            assert tune_main(["--space", "optim=adamw,sgd", "--dir", str(where / "t"), "--", *FAST]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and needle in err[0] and "another" not in err[0], err
    finally:
        for path in (ro, full):
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True)


def _fill_during_a_checkpoint(disk: Path, result_of, size: str):
    if not _mount_tmpfs(disk, f"size={size}"):
        pytest.skip("needs root and a tmpfs mount to make a filesystem fill up")
    try:
        code, err = result_of(disk / "run")
        assert code == 1 and "Traceback" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("ablate: step ") and f"no space left on {disk}/run (" in last and " free)" in last
        assert "is intact" in last
        assert not (disk / "run" / "checkpoint.tmp").exists()
        assert manifest.problem(disk / "run" / "checkpoint") is None
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], capture_output=True)   # an in-process run may hold its log


@pytest.mark.slow   # trains (in process): not the fast tier
def test_a_disk_that_fills_during_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, capsys):
    """A 4 MB filesystem holds two 1.6 MB checkpoints of the tiny model but not a third beside them: one line
    naming the filesystem and its free space, the partial checkpoint removed, the previous one intact. In
    process, one run to its third checkpoint, ~5 s."""
    def one_process(run_dir):
        code = main_in_process(monkeypatch, [*FAST, "train.steps=40", "train.checkpoint_every=2",
                                             f"hydra.run.dir={run_dir}"])
        return code, capsys.readouterr().err
    _fill_during_a_checkpoint(tmp_path / "disk", one_process, "4m")


@pytest.mark.slow
def test_a_disk_that_fills_during_a_sharded_checkpoint_is_one_line_on_every_rank(tmp_path):
    """fsdp2 on 2 ranks: DCP gathers both ranks' failures (ENOSPC on one, "unexpected pos" on the other) into
    an exception outside `Exception`; one line all the same, the partial checkpoint removed. One 2-rank run, ~25 s."""
    def two_ranks(run_dir):
        result = run_cli([*FAST, "parallel=fsdp2", "launcher.nproc_per_node=2", "train.steps=40",
                          "train.checkpoint_every=2", f"hydra.run.dir={run_dir}"])
        return result.returncode, result.stderr
    _fill_during_a_checkpoint(tmp_path / "disk", two_ranks, "5m")


def test_a_torn_metrics_line_is_dropped_on_resume(tmp_path):
    rows = [{"step": 2, "loss": 3.0}, {"step": 4, "loss": 2.0}, {"step": 6, "loss": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 8, "lo')
    checkpoint.truncate_metrics(tmp_path, 4)
    assert read_jsonl(tmp_path / "metrics.jsonl") == rows[:2]


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    ckpt = tmp_path / "old" / "checkpoint"
    ckpt.mkdir(parents=True)
    subprocess.run([sys.executable, "-c", (
        "import os, torch\n"
        "class Payload:\n"
        f"    def __reduce__(self): return (os.system, ('touch {marker}',))\n"
        f"torch.save({{'step': 1, 'evil': Payload()}}, '{ckpt / 'meta.pt'}')\n")], check=True)
    manifest.write(ckpt, 1, 1)   # listed as whole: the refusal must come from what meta.pt would run
    result = run_cli([*FAST, "train.steps=4", f"train.resume={tmp_path / 'old'}", f"hydra.run.dir={tmp_path}/new"])
    assert result.returncode == 2 and "refused (loading it could run code)" in one_line(result)
    assert not marker.exists()


def _finite(path: Path) -> bool:
    state = torch.load(path / "model_optimizer.pt", weights_only=True)
    return all(bool(torch.isfinite(t).all()) for t in state["model"].values())


@pytest.mark.slow   # trains (in process, ~2 s)
def test_nan_training_stops_in_one_line_and_never_checkpoints_nan(tmp_path, monkeypatch, capsys):
    args = [*FAST, "optim.lr=1e4", "train.steps=40", "train.checkpoint_every=2", f"hydra.run.dir={tmp_path}"]
    assert main_in_process(monkeypatch, args) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("ablate: stopped at step") and ("non-finite" in last or "not finite" in last)
    assert (tmp_path / "summary.json").exists()   # the figures up to the stop are kept
    for ckpt in (tmp_path / "checkpoint", tmp_path / "checkpoint.prev"):
        if ckpt.exists():
            assert _finite(ckpt), ckpt


@pytest.mark.slow   # trains (in process, ~2 s)
def test_a_run_that_ends_diverged_says_so_in_one_line_and_keeps_its_summary(tmp_path, monkeypatch, capsys):
    """Fewer non-finite steps than train.max_nonfinite_steps, but the last loss is NaN: not a success. The console's
    table prints NaN as such (it once raised converting NaN to an integer)."""
    code = main_in_process(monkeypatch, [*FAST, "optim.lr=1e8", "train.steps=8", f"hydra.run.dir={tmp_path}"])
    said = capsys.readouterr()
    err = said.err.strip().splitlines()
    assert code == 1 and err[-1].startswith("ablate: ended at step 8 with a non-finite loss"), err[-3:]
    assert "Traceback" not in said.err and units.fmt("loss", float("nan")) == "nan"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 8
    # its speed is not training's: the rates and utilisations are kept as invalid, with the reason
    assert summary["mfu"] is None and summary["tokens_per_s"] is None and summary["step_time_s"] is not None
    assert "the loss ended non-finite" in summary["invalid"]["tokens_per_s"]["reason"]


@pytest.mark.slow
def test_a_run_diverging_on_two_ranks_keeps_its_summary(tmp_path, capsys):
    """bf16 at lr 1e8 on 2 ddp ranks, W&B on (offline: rank 0's finish takes a second or two): every rank stops at
    the same step, and none leaves before rank 0 has written summary.json (without that the launcher stopped rank 0
    as it wrote it: 3 of 3 tries lost it). 2 ranks, ~15 s."""
    code = launch_in_process(["precision=bf16", "parallel=ddp", "launcher.nproc_per_node=2", "optim.lr=1e8",
                              "train.steps=12", "train.warmup_steps=1", "train.log_every=2",
                              "train.max_nonfinite_steps=3", "metrics.gemm_probe_n=64", "metrics.predict=false",
                              f"hydra.run.dir={tmp_path}"])
    assert code == 1 and (tmp_path / "summary.json").exists(), capsys.readouterr().err[-2000:]
    assert sorted(p.name for p in (tmp_path / ".failures").iterdir()) == ["stopped-rank0.txt", "stopped-rank1.txt"]


@pytest.mark.slow   # trains (in process): not the fast tier
def test_fp16_names_as_last_good_only_a_checkpoint_whose_loss_was_finite(tmp_path, monkeypatch, capsys):
    """fp16's loss scaler skips the overflowing steps, so the weights stay finite while the loss is NaN: a
    checkpoint counts as good once the next step's loss, from its weights, is finite; a bad one is set aside
    and a resume from the one named is finite. In process, two short runs, ~10 s."""
    code = main_in_process(monkeypatch, [*FAST, "precision=fp16", "optim.lr=2", "optim.schedule=warmup_linear",
                                         "optim.warmup_steps=12", "train.steps=14", "train.log_every=1",
                                         "train.checkpoint_every=1", "train.max_nonfinite_steps=3",
                                         f"hydra.run.dir={tmp_path}/a"])
    err = capsys.readouterr().err.strip().splitlines()
    named = re.search(r"last good checkpoint: (\S+) \(step (\d+)\)$", err[-1])
    assert code == 1 and named and named[1] == f"{tmp_path}/a/checkpoint", err[-3:]
    assert any("is set aside (checkpoint.broken)" in line for line in err) or \
        any("the loss is not finite, so no checkpoint was written" in line for line in err)
    rows = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    diverged = min(r["step"] for r in rows if r["loss"] is None)   # NaN is written as null
    assert int(named[2]) < diverged - 1        # its weights' loss, at the step after it, was finite
    resumed = main_in_process(monkeypatch, [*FAST, "precision=fp16", "optim.lr=1e-4", f"train.steps={diverged + 1}",
                                            f"train.resume={tmp_path}/a", f"hydra.run.dir={tmp_path}/b"])
    assert resumed == 0 and all(row["loss"] < 20 for row in read_jsonl(tmp_path / "b" / "metrics.jsonl"))


def _until_logged(run_dir: Path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "metrics.jsonl").exists() and read_jsonl(run_dir / "metrics.jsonl"):
            return
        time.sleep(0.2)
    raise AssertionError("the run logged nothing")


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_checkpoints_and_says_how_to_continue(tmp_path, sig, code, monkeypatch):
    """A real signal to a real 1-rank run; the resume through main() in process (a 1-rank parallel=none run)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "ablate", *FAST, "train.steps=400", "dataloader.read_latency_ms=30",
                             f"hydra.run.dir={run_dir}"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    _until_logged(run_dir, proc)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert f"stopped by {sig.name}: checkpoint at step" in last and f"train.resume={run_dir}" in last
    step = torch.load(run_dir / "checkpoint" / "meta.pt", weights_only=True)["step"]
    assert main_in_process(monkeypatch, [*FAST, f"train.steps={step + 4}", f"train.resume={run_dir}",
                                         f"hydra.run.dir={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_step"] == step
    logged = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert logged == sorted(set(logged))                          # every logged step once


def _files(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_refused_commands_leave_a_finished_run_dir_byte_identical(tmp_path, monkeypatch, capsys):
    """A second run into it (the line names the resume), a resume with another model, a resume asking for no
    more steps: each refused in one line before Hydra or ablate writes anything (no .hydra/, config.yaml or lock
    file touched). Through main() in process (~3 s; a refusal in a process of its own: test_cli.py)."""
    run = tmp_path / "run"
    first = [*FAST, "train.steps=4", "train.checkpoint_every=2", f"hydra.run.dir={run}"]
    assert main_in_process(monkeypatch, first) == 0
    capsys.readouterr()
    before = _files(run)
    for extra in ([], ["model=small", "train.steps=8", f"train.resume={run}"], [f"train.resume={run}"]):
        assert main_in_process(monkeypatch, [*FAST, "train.steps=4", *extra, f"hydra.run.dir={run}"]) == 2, extra
        said = capsys.readouterr().err.strip().splitlines()
        assert len(said) == 1 and said[0].startswith("ablate: error: "), said
        if not extra:
            assert "already holds a run" in said[0] and f"train.resume={run}" in said[0]
        assert _files(run) == before, extra


@pytest.mark.slow
@pytest.mark.parametrize("to_group,sig,code", [(True, signal.SIGINT, 130), (False, signal.SIGTERM, 143),
                                               (True, signal.SIGTERM, 143)],
                         ids=["ctrl-c-to-the-group", "sigterm-to-the-parent", "sigterm-to-the-group"])
def test_a_stop_signal_on_a_two_rank_run_checkpoints_once_and_says_so_in_one_line(tmp_path, to_group, sig, code):
    """Ctrl-C in a terminal: SIGINT to the whole process group (the parent, the fork server and both ranks),
    which the launcher forwards to the ranks again; one request all the same. SIGTERM to the parent alone: the
    launcher passes it on. SIGTERM to the group (systemd, Slurm ending a step; ~30 s): the fork server must
    outlive its ranks' checkpoint (launcher/fork_server.py). Each: exit 130/143, one line naming the
    checkpoint, no traceback; the resume runs (after Ctrl-C: the SIGTERM cases' checkpoints, written by the
    same stop, are checked whole in process: its step, every file against its manifest's checksum; two 2-rank
    resumes fewer, ~10 s)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "ablate", *FAST, "parallel=ddp", "launcher.nproc_per_node=2",
                             "train.steps=400", "dataloader.read_latency_ms=30", f"hydra.run.dir={run_dir}"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            **AS_TYPED_IN_A_TERMINAL)
    _until_logged(run_dir, proc)
    os.killpg(proc.pid, sig) if to_group else proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr[-2000:]
    said = [line for line in stderr.strip().splitlines() if not line.startswith("step ")]   # progress lines
    assert len(said) == 1 and "Traceback" not in stderr and "abort" not in stderr.lower(), stderr[-2000:]
    line = said[0]
    assert line.startswith(f"ablate: stopped by {sig.name}: checkpoint at step") and f"train.resume={run_dir}" in line
    if sig == signal.SIGINT:
        _two_ranks_resume_with_every_step_once(run_dir)
    else:
        step = int(re.search(r"checkpoint at step (\d+)", line).group(1))
        assert checkpoint.read_meta(run_dir / "checkpoint")["step"] == manifest.read(run_dir / "checkpoint")["step"] \
            == step
        assert manifest.problem(run_dir / "checkpoint") is None       # what a resume checks before it loads


@pytest.mark.slow
def test_kill_9_of_the_launcher_of_two_ranks_checkpoints_and_rank_0_says_so_in_one_line(tmp_path):
    """kill -9 of the parent of a 2-rank local run (the launcher, which can say nothing): at their next step
    the ranks see their parent gone, checkpoint, and rank 0 says so in one line; nothing keeps running, and
    the resume runs."""
    run_dir, said = tmp_path / "run", tmp_path / "stderr.txt"
    with open(said, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "ablate", *FAST, "parallel=ddp", "launcher.nproc_per_node=2",
                                 "train.steps=400", "dataloader.read_latency_ms=30", f"hydra.run.dir={run_dir}"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    _until_logged(run_dir, proc)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 90
    while _group_alive(proc.pid):
        assert time.monotonic() < deadline, "the ranks kept running after their launcher was killed"
        time.sleep(0.3)
    lines = [ln for ln in said.read_text().strip().splitlines() if not ln.startswith("step ")]
    assert len(lines) == 1 and "Traceback" not in said.read_text(), said.read_text()[-2000:]
    assert lines[0].startswith("ablate: the launching process") and f"train.resume={run_dir}" in lines[0]
    _two_ranks_resume_with_every_step_once(run_dir)


def test_the_ranks_agree_their_launcher_is_gone_when_only_a_peer_saw_it_first(monkeypatch):
    """Logic, in process (~0 s): the launcher dies between rank 0's look at its parent and rank 1's. The stop
    flags are reduced with MAX across the ranks (the peer's contribution stands in for rank 1 here); rank 0
    must learn both the stop and that the launcher is gone, or nobody says the one line (the race CI met)."""
    from ablate.train import signals
    monkeypatch.setattr(signals, "rank_env", lambda: type("Env", (), {"elastic": True, "in_slurm": False})())
    monkeypatch.setattr(signals, "_control_group", lambda: None)
    peer = torch.tensor([signal.SIGINT, 1, -1])        # rank 1: SIGINT from its parent's death, parent gone
    monkeypatch.setattr(signals.dist, "all_reduce", lambda t, op, group: t.copy_(torch.maximum(t, peer)))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        rank0 = signals.Preemption(world_size=2)        # still sees its parent: not orphaned by itself
        assert rank0.due(1) and rank0.signum == signal.SIGINT and rank0.orphaned
        rank0.restore()                                 # leaving: late copies of the stop are ignored now
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        peer.copy_(torch.tensor([0, 0, -(10 ** 9)]))
        quiet = signals.Preemption(world_size=2)
        assert not quiet.due(1) and not quiet.orphaned
        quiet.restore()                                 # not stopping: the handlers from before come back
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN   # (rank0's, from just before)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_the_ranks_agree_on_stopping_about_once_a_second_not_every_step(monkeypatch):
    """Logic, in process (~0 s): steps of 10 ms agree every ~100 steps (the most), steps of 2 s every step; every
    rank takes the soonest proposal, so all of them call the collective at the same steps."""
    from ablate.train import signals
    monkeypatch.setattr(signals, "rank_env", lambda: type("Env", (), {"elastic": False, "in_slurm": False})())
    monkeypatch.setattr(signals, "_control_group", lambda: None)
    calls, clock = [], [0.0]
    monkeypatch.setattr(signals.time, "monotonic", lambda: clock[0])
    peer = torch.tensor([0, 0, -(10 ** 9)])            # a peer that proposes nothing sooner
    monkeypatch.setattr(signals.dist, "all_reduce",
                        lambda t, op, group: calls.append(int(clock[0] * 1000)) or t.copy_(torch.maximum(t, peer)))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        rank = signals.Preemption(world_size=2)
        for step in range(1, 302):                     # 10 ms steps
            clock[0] += 0.01
            assert not rank.due(step)
        assert 3 <= len(calls) <= 5, calls             # step 1, then every ~100 steps
        calls.clear()
        for step in range(302, 306):                   # 2 s steps: every step, once the interval is re-agreed
            clock[0] += 2.0
            rank.due(step)
        assert len(calls) <= 2
        peer.copy_(torch.tensor([signal.SIGTERM, 0, -(10 ** 9)]))   # a peer was told to stop
        step = rank.next_check
        clock[0] += 2.0
        assert rank.due(step) and rank.signum == signal.SIGTERM
        rank.restore()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_dying_launchers_late_sigint_is_nobodys_second_ctrl_c(monkeypatch):
    """Logic, in process (~0.1 s): /proc tells a live process from one going down (an unreaped child: a zombie),
    and a SIGINT more than 2 s after the first, while the launcher is going down but still this rank's parent
    (a loaded host takes its threads down one by one, the kernel sends a SIGINT for each), is not a second
    Ctrl-C: it must not raise KeyboardInterrupt, which torch's spawn swallows, so that rank 0 would leave
    without saying its launcher was killed (CI, 1 run in about 10 under load)."""
    from ablate.train import signals
    assert not signals.exiting(os.getpid()) and not signals.exiting(None)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while not signals.exiting(child.pid):          # exited, not reaped: a zombie
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child.wait()
    assert signals.exiting(child.pid)              # reaped: no such process
    monkeypatch.setattr(signals, "rank_env", lambda: type("Env", (), {"elastic": True, "in_slurm": False})())
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        rank = signals.Preemption(world_size=1)
        rank._flag(signal.SIGINT, None)
        rank.first_at -= signals.REPEAT_WINDOW_S + 1
        monkeypatch.setattr(signals, "exiting", lambda pid: True)
        rank._flag(signal.SIGINT, None)            # the dying launcher's late copy: no KeyboardInterrupt
        monkeypatch.setattr(signals, "exiting", lambda pid: False)
        with pytest.raises(KeyboardInterrupt):     # a live launcher: a deliberate second Ctrl-C stops now
            rank._flag(signal.SIGINT, None)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)



def test_a_rank_knows_its_launcher_by_pid_and_start_time_not_by_its_parent():
    """Logic, in process (~0.2 s): our ranks are forked by a fork server, so their launcher is named by pid, and
    by start time against a reused pid. A launcher that ended is gone, reaped or still a zombie."""
    from ablate.train import signals
    me = signals.identity(os.getpid())
    assert me and not signals.gone(os.getpid(), me)
    assert signals.gone(os.getpid(), (me[0], str(int(me[1]) + 1)))     # the same pid, started later: reused
    child = subprocess.Popen(["sleep", "0.3"])
    known = signals.identity(child.pid)
    assert not signals.gone(child.pid, known)
    deadline = time.monotonic() + 30
    while signals.identity(child.pid)[0] != "Z":                         # ended, not reaped yet
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert signals.gone(child.pid, known)
    child.wait()
    assert signals.gone(child.pid, known) and signals.identity(child.pid) is None
    assert signals.gone(os.getpid(), None)       # a launcher already gone when the rank first looked


def test_a_forked_rank_runs_in_its_launchers_environment_as_it_is_now(monkeypatch):
    """Logic, in process (~0 s): a rank forked by the server starts with the server's environment (the
    launcher's when the server started); it takes the launcher's as it is at launch, plus what torch elastic
    set for it."""
    from ablate.launcher import local
    server = {"STALE": "left from the server's start", "PATH": "/old", "RANK": "1", "TORCHELASTIC_RUN_ID": "r"}
    monkeypatch.setattr(os, "environ", dict(server))
    local._adopt({"PATH": "/new", "WANDB_MODE": "offline"})
    assert os.environ == {"PATH": "/new", "WANDB_MODE": "offline", "RANK": "1", "TORCHELASTIC_RUN_ID": "r"}


def _two_ranks_resume_with_every_step_once(run_dir: Path) -> None:
    step = torch.load(run_dir / "checkpoint" / "meta.pt", weights_only=True)["step"]
    assert launch_in_process([*FAST, "parallel=ddp", "launcher.nproc_per_node=2", f"train.steps={step + 4}",
                              f"train.resume={run_dir}", f"hydra.run.dir={run_dir}"]) == 0   # real ranks, launched here
    logged = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert logged == sorted(set(logged)) and logged[-1] == step + 4


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow   # trains (in process): not the fast tier
def test_resume_refuses_what_cannot_change_and_applies_the_rest(tmp_path, monkeypatch, capsys):
    """In process: a 4-step run, two refusals, a resume from its previous checkpoint (~10 s)."""
    def run(*args):
        code = main_in_process(monkeypatch, [*FAST, *args])
        return code, capsys.readouterr().err

    assert run("train.steps=4", "train.checkpoint_every=2", f"hydra.run.dir={tmp_path}/a")[0] == 0
    resume = f"train.resume={tmp_path}/a"
    code, err = run("model=small", "train.steps=8", resume, f"hydra.run.dir={tmp_path}/b")
    assert code == 2 and "cannot continue under model." in err.strip().splitlines()[-1]
    code, err = run("train.steps=4", resume, f"hydra.run.dir={tmp_path}/c")
    assert code == 2 and "the checkpoint is at step 4" in err.strip().splitlines()[-1]
    (tmp_path / "a" / "checkpoint" / "model_optimizer.pt").write_bytes(b"not a checkpoint")   # a damaged latest
    code, err = run("train.steps=8", "optim.lr=1e-4", resume, f"hydra.run.dir={tmp_path}/d")
    assert code == 0, err[-2000:]
    assert "resuming from" in err and "checkpoint.prev" in err
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2                         # the previous checkpoint
    assert summary["resume"]["changed"] == {"optim.lr": [0.003, 0.0001]}
    # both attempts' measured steps: 0 of steps 1-2 (warm-up, memory-tracked), 4 of 3-8 (its warm-up, its
    # memory-tracked second step)
    assert summary["measured_steps"] == 0 + 4


@pytest.mark.slow
def test_wandb_online_without_a_server_falls_back_to_offline(tmp_path):
    result = run_cli(["train.steps=6", "train.warmup_steps=1", "metrics.gemm_probe_n=64",
                      "metrics.predict=false", "logger.init_timeout_s=5",
                      f"hydra.run.dir={tmp_path}"],
                     env={"WANDB_MODE": "online", "WANDB_API_KEY": "a" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "logging offline" in result.stderr and "Traceback" not in result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["wandb"]["mode"] == "offline" and list((tmp_path / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_killing_wandbs_helper_never_stops_training(tmp_path):
    """W&B's helper process (wandb-core) killed mid-run: the run goes on to its last step and says W&B
    stopped. W&B gets 120 s to start (not the default 15: on a loaded host a slow start would disable W&B
    and leave no helper to kill, which is another test's story), and the helper is looked for until it is
    there (~10 s quiet)."""
    proc = subprocess.Popen([sys.executable, "-m", "ablate", "train.steps=60", "train.warmup_steps=1",
                             "dataloader.read_latency_ms=30", "metrics.gemm_probe_n=64",
                             "metrics.predict=false", "logger.init_timeout_s=120",
                             f"hydra.run.dir={tmp_path}"],
                            cwd=REPO, stderr=subprocess.PIPE, text=True, env={**os.environ, "WANDB_MODE": "offline"})
    _until_logged(tmp_path, proc)
    deadline, helpers = time.monotonic() + 60, []
    while not helpers and proc.poll() is None and time.monotonic() < deadline:
        helpers = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "wandb-core"], capture_output=True,
                                 text=True).stdout.split()
        time.sleep(0.1)
    for pid in helpers:
        os.kill(int(pid), signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert helpers, f"no wandb-core helper found to kill:\n{stderr[-2000:]}"
    assert proc.returncode == 0, stderr[-2000:]
    assert "W&B stopped" in stderr and "Traceback" not in stderr
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")][-1] == 60


RANK1_SHARD = {"zero3": "deepspeed/latest/zero_pp_rank_1_mp_rank_00_optim_states.pt", "fsdp2": "dcp/__1_0.distcp"}
SHARDED = [*FAST, "launcher.nproc_per_node=2", "train.checkpoint_every=2"]


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """A finished 2-rank run per sharded strategy (6 steps, a checkpoint every 2: latest at step 6, prev at 4),
    trained once for the tests that damage it; each damages a copy of its own (so one 2-rank run per
    strategy, ~20 s each, not one per test; launched from this process: conftest.launch_in_process). A copied
    run dir resumes as the original would."""
    trained = {}

    def copy_for(strategy: str, tmp_path: Path) -> Path:
        if strategy not in trained:
            run = tmp_path_factory.mktemp(f"trained-{strategy}") / "run"
            assert launch_in_process([*SHARDED, f"parallel={strategy}", "train.steps=6", f"hydra.run.dir={run}"]) == 0
            trained[strategy] = run
        return Path(shutil.copytree(trained[strategy], tmp_path / "run"))
    return copy_for


@pytest.mark.slow
@pytest.mark.xdist_group("sharded")   # the tests damaging copies of one trained run share it on one worker
@pytest.mark.parametrize("strategy,manifests", [("zero3", False), ("fsdp2", True), ("fsdp2", False)],
                         ids=["zero3-without-manifests", "fsdp2", "fsdp2-without-manifests"])
def test_a_shard_gone_from_the_latest_checkpoint_resumes_every_rank_from_the_previous(tmp_path, strategy,
                                                                                     manifests, sharded_run):
    """One rank's shard removed from the latest checkpoint: every rank continues from the previous one (said
    once, with the reason), the damaged one is set aside, not rotated over the good one, and no step is
    logged twice."""
    run = sharded_run(strategy, tmp_path)
    (run / "checkpoint" / RANK1_SHARD[strategy]).unlink()
    if not manifests:   # lost: their copies beside the checkpoints (checkpoint_digests.json) still verify them
        for listing in run.glob("checkpoint*/manifest.json"):
            listing.unlink()
    resumed = run_cli([*SHARDED, f"parallel={strategy}", "train.steps=8", f"train.resume={run}",
                       f"hydra.run.dir={run}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    warned = [ln for ln in resumed.stderr.splitlines() if "warning: resuming from" in ln]
    assert len(warned) == 1 and "checkpoint.prev" in warned[0] and "is missing" in warned[0], resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["resume"]["from"].endswith("checkpoint.prev")
    assert checkpoint.read_meta(run / "checkpoint")["step"] == 8
    assert manifest.problem(run / "checkpoint") is None and manifest.problem(run / "checkpoint.prev") is None
    assert (run / "checkpoint.broken").is_dir()     # set aside for a look, never resumed from
    logged = [r["step"] for r in read_jsonl(run / "metrics.jsonl")]
    assert logged == sorted(set(logged)) and logged[-1] == 8


@pytest.mark.slow
@pytest.mark.xdist_group("sharded")
def test_no_complete_checkpoint_is_refused_in_one_line_before_any_rank_starts(tmp_path, sharded_run):
    """zero3 on 2 ranks, a model shard gone from both checkpoints: exit 2, one line naming the missing
    file, and the run dir as it was."""
    run = sharded_run("zero3", tmp_path)
    shards = list(run.glob("checkpoint*/deepspeed/latest/*model_states.pt"))
    assert len(shards) == 4
    for shard in shards:
        shard.unlink()
    before = _files(run)
    result = run_cli([*SHARDED, "parallel=zero3", "train.steps=8", f"train.resume={run}", f"hydra.run.dir={run}"])
    assert result.returncode == 2
    line = one_line(result)
    assert "no complete checkpoint" in line and "model_states.pt is missing" in line
    assert _files(run) == before


def test_a_read_only_sweep_dir_or_report_dir_is_one_line(tmp_path, capsys):
    """ablate.sweeps --dir and ablate.report on a read-only filesystem: exit 2 in one line (in process, ~1 s)."""
    from ablate import report
    from ablate.sweeps.__main__ import main as sweeps_main
    from test_report import fake_run

    ro = tmp_path / "ro"
    if not _mount_tmpfs(ro, "size=1m"):
        pytest.skip("needs root and a tmpfs mount to make a read-only filesystem")
    try:
        fake_run(ro, "a", {"precision": {"name": "fp32"}}, tokens_per_s=1.0)
        fake_run(ro, "b", {"precision": {"name": "bf16"}}, tokens_per_s=2.0)
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        assert sweeps_main(["c3_no_sync", "--dir", str(ro / "D")]) == 2
        assert "cannot be written (Read-only file system); choose another folder" in capsys.readouterr().err
        assert report.main([str(ro)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the report cannot be written (Read-only file system" in err[0], err
    finally:
        subprocess.run(["umount", "--lazy", str(ro)], capture_output=True)


def test_a_report_is_never_written_into_a_run(tmp_path, capsys):   # in process, ~1 s
    from ablate import report
    from test_report import fake_run

    fake_run(tmp_path, "done", {"precision": {"name": "fp32"}}, tokens_per_s=1.0)
    fake_run(tmp_path, "other", {"precision": {"name": "bf16"}}, tokens_per_s=2.0)
    live = tmp_path / "live"
    live.mkdir()
    (live / "config.yaml").write_text("precision:\n  name: bf16\n")       # started, no summary.json yet
    before = {p: p.read_bytes() for d in ("done", "other") for p in (tmp_path / d).rglob("*") if p.is_file()}
    assert report.main([str(tmp_path / "done"), str(tmp_path / "other"), str(live)]) == 0   # beside them, not in
    assert (tmp_path / "report-done-other-live" / "report.md").is_file()
    assert sorted(p.name for p in live.iterdir()) == ["config.yaml"]
    assert {p: p.read_bytes() for d in ("done", "other") for p in (tmp_path / d).rglob("*") if p.is_file()} == before
    capsys.readouterr()
    assert report.main([str(tmp_path / "done"), str(tmp_path / "other"), "--out", str(live)]) == 2
    assert "is a run's folder: a report never writes into a run" in capsys.readouterr().err
    assert sorted(p.name for p in live.iterdir()) == ["config.yaml"]


def test_a_checkpoint_without_its_manifest_is_never_loaded_unchecked(tmp_path, monkeypatch, capsys):
    """manifest.json deleted and 64 bytes flipped in the latest checkpoint: its copy in checkpoint_digests.json
    catches the flip and the run resumes from the previous checkpoint, saying so; with no copy either, nothing
    vouches for it: refused in one line, exit 2 (in process, three 1-rank runs, ~5 s)."""
    run = tmp_path / "run"
    short = ["logger=none", "train.log_every=2", "train.checkpoint_every=4", "metrics.gemm_probe_n=128",
             "metrics.predict=false"]
    assert main_in_process(monkeypatch, [*short, "train.steps=8", f"hydra.run.dir={run}"]) == 0
    (run / "checkpoint" / "manifest.json").unlink()
    state = run / "checkpoint" / "model_optimizer.pt"
    data = bytearray(state.read_bytes())
    data[-200:-136] = bytes(b ^ 0xFF for b in data[-200:-136])
    state.write_bytes(bytes(data))
    capsys.readouterr()
    assert main_in_process(monkeypatch, [*short, "train.steps=10", f"train.resume={run}"]) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "warning: resuming from" in ln]
    assert len(warned) == 1 and "checkpoint.prev" in warned[0] and "does not match its checksum" in warned[0], warned
    broken = run / "checkpoint.broken"
    (run / "checkpoint_digests.json").unlink()
    again = tmp_path / "again"
    shutil.copytree(broken, again / "checkpoint")
    (again / "checkpoint" / "manifest.json").unlink(missing_ok=True)
    assert main_in_process(monkeypatch, [*short, "train.steps=12", f"train.resume={again}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be verified (no manifest.json" in err[0], err


@pytest.mark.slow
def test_the_rank_that_failed_is_the_one_named(tmp_path):
    """2 local ranks (three `python -m ablate`, ~40 s): rank 1 killed with SIGKILL at step 8 (it says nothing; rank 0
    then loses its peer) -> the one line names rank 1; rank 1 stopped (SIGSTOP) for 4 s at step 20 -> the stall in
    summary.json names rank 1, the rank that held the others up; under fsdp2 too, stopped inside the step."""
    common = ["parallel=ddp", "launcher.nproc_per_node=2", "logger=none", "metrics.gemm_probe_n=64",
              "metrics.predict=false"]
    killed = run_cli([*common, "train.steps=30", f"hydra.run.dir={tmp_path / 'killed'}"], env=planted(kill="1:8"))
    assert killed.returncode == 1 and "Traceback" not in killed.stderr, killed.stderr[-3000:]
    last = killed.stderr.strip().splitlines()[-1]
    # torch elastic reports the killed rank itself when it sees it first (a loaded host), else its peer's error
    assert last.startswith(("ablate: rank 1 ended without a word (killed: kill -9, the OOM killer?); rank 0 stopped "
                            "too", "ablate: rank 1 failed (exit code -9)")), last
    stopped = run_cli([*common, "train.steps=40", f"hydra.run.dir={tmp_path / 'stopped'}"],
                      env=planted(stop="1:20:4"))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    stalls = json.loads((tmp_path / "stopped" / "summary.json").read_text())["stalls"]
    assert [(s["step"], s["rank"]) for s in stalls] == [(20, 1)] and stalls[0]["seconds"] >= 4, stalls
    # under fsdp2, stopped 20 ms into step 20 (inside a collective it entered, or computing: ~12 s more)
    fsdp2 = run_cli(["parallel=fsdp2", *common[1:], "train.steps=30", f"hydra.run.dir={tmp_path / 'fsdp2'}"],
                    env=planted(stop="1:20:4:0.02"))
    assert fsdp2.returncode == 0, fsdp2.stderr[-3000:]
    stalls = json.loads((tmp_path / "fsdp2" / "summary.json").read_text())["stalls"]
    assert [(s["rank"], s["stopped"]) for s in stalls] == [(1, True)] and stalls[0]["step"] in (20, 21), stalls


@pytest.mark.slow   # trains (in process): not the fast tier
def test_a_disk_that_fills_while_metrics_are_written_stops_in_one_line(tmp_path, monkeypatch, capsys):
    """Another job fills the run's filesystem at step 7 (a planted hook); a row of the next steps (as soon as the
    file needs another page) cannot be written: one line naming metrics.jsonl and the checkpoint of step 6, which
    is intact (in process, one 1-rank run, ~3 s)."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "size=8m"):
        pytest.skip("needs root and a tmpfs mount to make a filesystem fill up")
    try:
        for key, value in planted(fill=f"{disk}:7").items():
            monkeypatch.setenv(key, value)
        code = main_in_process(monkeypatch, [*FAST, "train.steps=20", "train.log_every=1", "train.checkpoint_every=6",
                                             f"hydra.run.dir={disk / 'run'}"])
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert code == 1 and "Traceback" not in err, err[-3000:]
        assert re.match(r"ablate: stopped at step (7|8|9|10|11): ", last), last
        assert "metrics.jsonl cannot be written (No space left on device" in last, last
        assert "checkpoint (step 6), intact" in last, last
        assert manifest.problem(disk / "run" / "checkpoint") is None
        assert checkpoint.read_meta(disk / "run" / "checkpoint")["step"] == 6
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], capture_output=True)


# -- a user's code that fails: named in one line, the traceback kept, nothing recorded lost ----------------------

@pytest.mark.slow   # two 1-rank runs in process (~2 s each) and one of 2 ranks (~8 s)
def test_a_collector_that_raises_is_named_in_one_line_and_the_summary_kept(tmp_path, monkeypatch, capsys,
                                                                         user_files):
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    for at, ranks, says in ((3, 1, "Raises.on_step() raised at step 3: ValueError: a bug in my collector"),
                            (0, 1, "Raises.summary() raised: KeyError: 'the totals I forgot'"),
                            (3, 2, "Raises.on_step() raised at step 3: ValueError")):
        run = tmp_path / f"at{at}_{ranks}"
        args = [*FAST, "train.steps=8", f"metrics.collectors=[{{_target_: brokencollectors.Raises, at: {at}}}]",
                f"launcher.nproc_per_node={ranks}", *(["parallel=ddp"] if ranks > 1 else []), f"hydra.run.dir={run}"]
        code = launch_in_process(args) if ranks > 1 else main_in_process(monkeypatch, args)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and says in err[-1] and "Traceback" not in "\n".join(err), err[-3:]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["raised_at"] is None and "Raises" in summary["notes"]["collectors.Raises"]
        # the stopping rank's note (on 2 ranks both stop; one may leave first and the launcher end the other before
        # it writes its own: seen once in a loaded suite)
        notes = sorted((run / ".failures").glob("stopped-rank*.txt"))
        assert notes and all("Traceback" in n.read_text() for n in notes), notes
    refused = main_in_process(monkeypatch, [*FAST, "metrics.collectors=[{_target_: brokencollectors.Raises, when: 3}]",
                                            f"hydra.run.dir={tmp_path / 'never'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert refused == 2 and "Raises(when=3) fails: got an unexpected keyword argument 'when'" in err[-1], err
    assert not (tmp_path / "never").exists()


@pytest.mark.slow   # 2 ranks (~8 s)
def test_a_rank_that_raises_leaves_its_traceback_and_a_short_line(tmp_path, capsys, user_files, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", user_files.env["PYTHONPATH"])   # the ranks' path, and this launcher's
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    code = launch_in_process(["--config-dir", str(user_files.config_dir), "model=fails", *FAST, "parallel=ddp",
                              "launcher.nproc_per_node=2", f"hydra.run.dir={tmp_path}"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    # Both ranks raise; the line names whichever failed first (as torchrun's does), and that rank's note.
    rank = re.search(r"rank (\d+) failed", line).group(1)
    note = tmp_path / ".failures" / f"rank{rank}.txt"
    assert code == 1 and len(line) < 300 and f"(traceback: {note})" in line, line
    assert "RuntimeError: a long error" in line and "Traceback (most recent call last)" in note.read_text()
