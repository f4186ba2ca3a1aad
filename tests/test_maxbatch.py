"""C5's largest-batch search: the doubling + bisection on hand-checked predicates, and the real search on
this CPU against two peak-RSS budgets (each trial a real `python -m ablate` process)."""
import json

import pytest

from ablate.maxbatch import search
from conftest import read_jsonl, run_module


def _recording(limit_that_fits):
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch <= limit_that_fits
    return fits, tried


def test_doubling_then_bisection_finds_the_boundary():
    fits, tried = _recording(37)
    assert search(fits, start=1, limit=4096, multiple=1) == 37
    # 1..32 fit, 64 misses; then 48, 40, 36, 38, 37 (bisection between 32 and 64)
    assert tried == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]


def test_steps_of_eight_stop_at_the_largest_multiple():
    fits, tried = _recording(37)
    assert search(fits, start=8, limit=4096, multiple=8) == 32
    assert tried == [8, 16, 32, 64, 48, 40]


def test_nothing_fits_or_everything_fits_up_to_the_limit():
    assert search(lambda b: False, start=4, limit=64, multiple=4) is None
    fits, tried = _recording(10_000)
    assert search(fits, start=1, limit=100, multiple=1) == 100
    assert tried[:7] == [1, 2, 4, 8, 16, 32, 64] and max(tried) == 100


WORKLOAD = ["model=tiny", "model.max_seq_len=1024", "train.seq_len=1024"]


@pytest.mark.slow
def test_a_larger_budget_finds_a_larger_batch_on_this_cpu(tmp_path):
    """Measured here (tiny model, 1024 tokens, 3 steps): peak RSS ~0.66 GB at batch 16, ~0.94 GB at 32,
    ~1.2 GB at 48, ~1.5 GB at 64: about 18 MB per sequence over ~0.37 GB of runtime and model; 2 steps (the
    second holds the optimizer's state, as every later one) peak the same: 0.65, 0.91, 1.22, 1.51 GB. In steps
    of 32: a 1.4 GB budget holds 32 and not 64, searched here for real (two trials, each a process; in steps of
    16 it was four, ~50 s); a 0.8 GB budget, put to the same measured trials, holds none of them (the README
    types a 0.8 GB search in steps of 16 for real: 16 fits). Activations decide."""
    budget, run_dir = "1.4", tmp_path / "1.4"
    result = run_module("ablate.maxbatch", ["--mem-budget-gb", budget, "--multiple-of", "32", "--steps", "2",
                                            "--", *WORKLOAD, "logger=wandb", f"hydra.run.dir={run_dir}"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["figure"] == "mem_peak_bytes" and summary["device"] == "cpu"
    assert "not the CUDA caching allocator" in summary["notes"]["max_batch"]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["batch_size"] for r in rows] == [t["batch_size"] for t in summary["trials"]]
    assert all(t["fits"] == (t["peak_bytes"] <= float(budget) * 1e9) for t in summary["trials"])
    assert summary["max_batch"] == 32 and "max_batch: 32" in result.stdout
    peaks = {t["batch_size"]: t["peak_bytes"] for t in summary["trials"]}
    assert sorted(peaks) == [32, 64] and peaks[32] < peaks[64]
    assert search(lambda batch: peaks[batch] <= 0.8e9, start=32, limit=4096, multiple=32) is None
    assert summary["wandb"]["mode"] == "offline" and list((run_dir / "wandb").glob("offline-run-*"))   # W&B


def test_bad_search_options_are_one_line(tmp_path):
    result = run_module("ablate.maxbatch", ["--multiple-of", "0", "--", "logger=none"])
    assert result.returncode == 2 and "argument --multiple-of: 0: out of range; allowed: >= 1" in result.stderr
    result = run_module("ablate.maxbatch", ["--", "precision=fp9", f"hydra.run.dir={tmp_path}/x"])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "precision=fp9" in result.stderr and not (tmp_path / "x").exists()


def test_on_cuda_the_allocator_decides_not_ablates_estimate(tmp_path):
    """ablate's static memory refusal is one figure for both allocators: on CUDA a trial skips it, so the
    CUDA OOM (where expandable segments make the difference) decides; on a CPU the estimate stays."""
    from ablate.maxbatch import Trials

    assert "train.skip_memory_check=true" in Trials([], tmp_path, None, 4, cuda=True).overrides_at(64)
    assert "train.skip_memory_check=true" not in Trials([], tmp_path, None, 4, cuda=False).overrides_at(64)


@pytest.mark.slow
def test_sigterm_stops_the_search_and_its_trial_and_keeps_what_it_found(tmp_path):
    """SIGTERM mid-search: the running trial's whole process group is stopped, the finished trials are
    recorded (summary.json with `stopped`, the largest batch that fitted), one line, exit 143."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    run_dir = tmp_path / "search"
    proc = subprocess.Popen([sys.executable, "-m", "ablate.maxbatch", "--mem-budget-gb", "100", "--steps", "3", "--",
                             *WORKLOAD, "logger=none", f"hydra.run.dir={run_dir}"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    while "trial 1:" not in seen:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-3000:]
        seen += line
    deadline = time.monotonic() + 60
    while not (run_dir / "max_batch_trials" / "batch_00002" / "config.yaml").exists():   # trial 2 is running
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("ablate.maxbatch: stopped by SIGTERM after 1 trials")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] == "SIGTERM" and summary["max_batch"] is None
    assert summary["largest_fit_so_far"] == 1 and [t["batch_size"] for t in summary["trials"]] == [1]
    left = subprocess.run(["pgrep", "-f", str(run_dir / "max_batch_trials")], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"a trial still runs: {left.stdout}"
