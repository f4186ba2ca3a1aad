"""Safe under concurrency (#33): a run directory is claimed before anything is written into it, so of two
runs started at once into one directory exactly one trains and the other touches nothing; one sweep that a
second identical call, a crash and a Ctrl-C cannot break; Ctrl-C to a `-m` call reaches its job."""
import json
import os
import signal
import subprocess
import sys
import time
from typing import List

import pytest
import yaml

from conftest import AS_TYPED_IN_A_TERMINAL, REPO


@pytest.mark.slow
def test_two_runs_into_one_directory_one_trains_the_other_touches_nothing(tmp_path):
    """Two 2-rank ddp runs started together, seeds 1 and 2 (~20 s)."""
    run_dir = tmp_path / "shared"
    common = [sys.executable, "-m", "ablate", "parallel=ddp", "launcher.nproc_per_node=2", "logger=none",
              "train.steps=6", "train.warmup_steps=2", "metrics.gemm_probe_n=64",
              "metrics.predict=false", f"hydra.run.dir={run_dir}"]
    procs = [subprocess.Popen([*common, f"train.seed={seed}"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2).strip().splitlines()
    assert len(refused) == 1 and ("another run is writing into it" in refused[0] or "already holds a run" in
                                  refused[0]), refused
    seed = yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["seed"]
    assert yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())["train"]["seed"] == seed
    assert (run_dir / "summary.json").exists()


def ctrl_c_once(cmd, ready) -> subprocess.Popen:
    """`cmd` started as a terminal would (its own process group), then Ctrl-C to that group (SIGINT to every
    process in it) once `ready()`."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **AS_TYPED_IN_A_TERMINAL)
    wait_for(proc, ready)
    os.killpg(proc.pid, signal.SIGINT)
    return proc


def wait_for(proc: subprocess.Popen, ready, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)


def processes_of(d) -> List[str]:
    """Processes whose command line names `d` (this test's own: tests run side by side)."""
    return subprocess.run(["pgrep", "-f", str(d)], capture_output=True, text=True).stdout.split()


@pytest.mark.slow
def test_a_sweep_survives_a_second_call_a_crash_and_ctrl_c_and_runs_nothing_twice(tmp_path):
    """One sweep's story (#33), `ablate.sweeps aa_noise --repeats 2` (4 runs, ~2 min; three tests before):
    - a second identical call while it runs is refused in one line (exit 2);
    - kill -9 of the driver and its running child (a crash): the same command keeps the finished runs and
      sets the broken one aside (never deleted);
    - Ctrl-C to that call's process group (a terminal's) while it runs the broken run again: the run is told
      to stop, the driver exits 130 in one line, no process of the sweep is left 15 s later;
    - the same command then finishes the sweep and nothing finished runs twice; once more, it runs nothing;
      a call with fewer repeats is refused."""
    d = tmp_path / "D"
    cmd = [sys.executable, "-m", "ablate.sweeps", "aa_noise", "--repeats", "2", "--dir", str(d), "--",
           "logger=none", "train.steps=40", "metrics.gemm_probe_n=64", "metrics.predict=false",
           "dataloader.read_latency_ms=80"]   # each run >= 3 s wherever it runs: killed and Ctrl-C'd mid-way
    driver = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    wait_for(driver, lambda: (d / ".ablate.lock").exists())
    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    refused = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(refused) == 1, second.stderr
    assert "another ablate.sweeps call is running this sweep" in refused[0]

    wait_for(driver, lambda: len(list(d.glob("aa_noise/*/summary.json"))) == 2
             and list(d.glob("aa_noise/003_*/metrics.jsonl")))
    child = subprocess.run(["pgrep", "-f", f"hydra.run.dir={d}.*003_r1"], capture_output=True,
                           text=True).stdout.split()
    os.kill(driver.pid, signal.SIGKILL)
    for pid in child:                                   # the run, in a process group of its own
        os.killpg(int(pid), signal.SIGKILL)
    driver.wait()
    finished = {p: p.stat().st_mtime for p in d.glob("aa_noise/*/summary.json")}
    assert len(finished) == 2

    again = ctrl_c_once(cmd, lambda: list(d.glob("aa_noise/003_*.incomplete-1"))   # set aside, run again
                        and [p for p in d.glob("aa_noise/003_*/metrics.jsonl") if ".incomplete-" not in str(p)])
    out, err = again.communicate(timeout=300)
    assert again.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("ablate.sweeps: stopped by SIGINT")
    assert out.count("finished in an earlier call: kept") == 2
    gone_by = time.time() + 15                       # none of the sweep's processes is left 15 s later
    while processes_of(d) and time.time() < gone_by:
        time.sleep(0.5)
    assert not processes_of(d), processes_of(d)

    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" not in done.stdout + done.stderr and "still running" not in done.stdout
    assert {p: p.stat().st_mtime for p in finished} == finished               # nothing finished ran twice
    assert len(list(d.glob("aa_noise/*/summary.json"))) == 4
    assert list(d.glob("aa_noise/003_*.incomplete-1/metrics.jsonl"))         # the crashed one kept, aside
    third = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and third.stdout.count("finished in an earlier call: kept") == 4
    fewer = subprocess.run(cmd[:5] + ["1"] + cmd[6:], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert fewer.returncode == 2 and "plan.json is another call's plan" in fewer.stderr


@pytest.mark.slow
def test_ctrl_c_to_a_multirun_reaches_its_job_and_the_same_command_finishes_the_grid(tmp_path):
    """Ctrl-C to a `-m` call's process group after its first job: the job in progress (in its own group) is told
    to stop by the parent, checkpoints, and the parent exits 130 in one line naming how the grid continues;
    nothing is left running. The same command again keeps the first job as it was, continues the second from its
    checkpoint and runs the third (4 1-rank jobs, ~30 s)."""
    d = tmp_path / "grid"
    cmd = [sys.executable, "-m", "ablate", "-m", "train.seed=1,2,3", "train.steps=200", "train.log_every=5",
           "dataloader.read_latency_ms=10", "logger=none", "metrics.gemm_probe_n=64",
           "metrics.predict=false", f"hydra.sweep.dir={d}"]
    parent = ctrl_c_once(cmd, lambda: list(d.glob("1_*/metrics.jsonl")))
    _, err = parent.communicate(timeout=200)
    last = err.strip().splitlines()[-1]
    assert parent.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert last.startswith("ablate: stopped by SIGINT") and "the same command finishes the grid" in last
    (first,), (second,) = d.glob("0_*"), d.glob("1_*")
    assert (first / "summary.json").is_file() and (second / "checkpoint" / "meta.pt").is_file()
    assert not list(d.glob("2_*")) and not processes_of(d), processes_of(d)
    kept = {p: p.stat().st_mtime for p in first.rglob("*") if p.is_file()}
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(d.glob("*/summary.json"))) == 3
    assert {p: p.stat().st_mtime for p in first.rglob("*") if p.is_file()} == kept    # the first job untouched
    resumed = json.loads((second / "summary.json").read_text())
    assert resumed["steps"] == 200 and resumed["resumed_from_step"] > 0


def test_a_childs_output_outlives_its_driver_killed_with_minus_9(tmp_path):
    """A driver (ablate.sweeps, tune, maxbatch) killed outright leaves its child running in its own session: the
    child's lines go to a file, not a pipe with no reader, so it writes on and finishes (a real driver process
    and a 3-second child, ~4 s). A sweep's next call then waits for that run and keeps it."""
    done = tmp_path / "done"
    child = (f"import sys, time\nfor i in range(30):\n    print('line', i, file=sys.stderr, flush=True)\n"
             f"    time.sleep(0.1)\nopen({str(done)!r}, 'w').write('finished')\n")
    driver = subprocess.Popen([sys.executable, "-c", "import sys; from ablate.launcher import group; "
                               f"group.run([sys.executable, '-c', {child!r}])"], start_new_session=True)
    time.sleep(1.0)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 20
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert done.exists() and done.read_text() == "finished"
