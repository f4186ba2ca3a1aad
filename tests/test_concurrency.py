"""Safe under concurrency (#33): a run directory is claimed before anything is written into it, so of two
runs started at once into one directory exactly one trains and the other touches nothing; two identical
ablate.sweeps calls into one --dir: the second is refused while the first runs."""
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO


@pytest.mark.slow
def test_two_runs_into_one_directory_one_trains_the_other_touches_nothing(tmp_path):
    """Two 2-rank ddp runs started together, seeds 1 and 2 (~20 s)."""
    run_dir = tmp_path / "shared"
    common = [sys.executable, "-m", "ablate", "parallel=ddp", "launcher.nproc_per_node=2", "logger=none",
              "train.steps=6", "train.warmup_steps=2", "metrics.gemm_probe_n=64", f"hydra.run.dir={run_dir}"]
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


@pytest.mark.slow
def test_a_second_identical_sweep_call_is_refused_while_the_first_runs(tmp_path):
    """ablate.sweeps aa_noise twice into one --dir (~30 s): the second exits 2 in one line, the first's runs
    all finish once."""
    d = tmp_path / "D"
    cmd = [sys.executable, "-m", "ablate.sweeps", "aa_noise", "--dir", str(d), "--", "logger=none",
           "train.steps=8", "metrics.gemm_probe_n=64"]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (d / ".ablate.lock").exists() and time.time() < deadline:
        time.sleep(0.05)
    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2 and "another ablate.sweeps call is running this sweep" in second.stderr
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    assert "FAILED" not in out + err and "still running" not in out
    assert len(list(d.rglob("summary.json"))) == 2


def ctrl_c_once_training(cmd, d, logged: str) -> subprocess.Popen:
    """`cmd` started as a terminal would (its own process group), then Ctrl-C to that group (SIGINT to every
    process in it) once a run under `d` has logged a step."""
    import os
    import signal

    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 300
    while not list(d.glob(logged)):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    return proc


@pytest.mark.slow
def test_ctrl_c_to_a_sweep_stops_its_run_and_the_same_command_finishes_it(tmp_path):
    """Ctrl-C reaches the driver's process group (a terminal's): the run it started (in its own session) is
    told to stop, the driver exits 130 in one line, nothing of the sweep is left, and the same command then
    finishes the sweep (~60 s)."""

    d = tmp_path / "D"
    cmd = [sys.executable, "-m", "ablate.sweeps", "aa_noise", "--repeats", "2", "--dir", str(d), "--",
           "logger=none", "train.steps=60", "metrics.gemm_probe_n=64"]
    driver = ctrl_c_once_training(cmd, d, "aa_noise/*/metrics.jsonl")
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("ablate.sweeps: stopped by SIGINT")
    time.sleep(15)
    left = subprocess.run(["pgrep", "-f", str(d)], capture_output=True, text=True).stdout.split()
    assert not left, left
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(list(d.glob("aa_noise/*/summary.json"))) == 4


@pytest.mark.slow
def test_ctrl_c_to_a_multirun_reaches_its_job_which_checkpoints(tmp_path):
    """Ctrl-C to a `-m` call's process group: the job in progress (in its own group) is told to stop by the
    parent, checkpoints, and the parent exits 130 in one line naming how the job continues; nothing is left
    running (one 1-rank job stopped early, ~20 s)."""

    d = tmp_path / "grid"
    parent = ctrl_c_once_training([sys.executable, "-m", "ablate", "-m", "train.seed=0,1", "train.steps=2000",
                                   "train.log_every=5", "logger=none", "metrics.gemm_probe_n=64",
                                   f"hydra.sweep.dir={d}"], d, "0_*/metrics.jsonl")
    _, err = parent.communicate(timeout=200)
    last = err.strip().splitlines()[-1]
    assert parent.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert last.startswith("ablate: stopped by SIGINT") and "continues with train.resume=" in last
    (job,) = d.glob("0_*")
    assert (job / "checkpoint" / "meta.pt").is_file() and not list(d.glob("1_*"))
    left = subprocess.run(["pgrep", "-f", str(d)], capture_output=True, text=True).stdout.split()
    assert not left, left
