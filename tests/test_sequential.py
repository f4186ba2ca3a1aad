"""Repeats that stop by themselves: Bonferroni over the looks keeps the false-positive rate of peeking at or
below 5% (seeded synthetic A/A sequences), and a real sweep stops and says why."""
import json
import math
import random

import pytest

from ablate.report import sequential, stats


def false_positive_rate(level: float, looks=range(2, 11), sequences: int = 2000, sd: float = 0.1) -> float:
    """Share of A/A sequences (true ratio exactly x1) that any look declares decided against x1."""
    rng, wrong = random.Random(7), 0
    for _ in range(sequences):
        logs = [rng.gauss(0, sd) for _ in range(max(looks))]
        for n in looks:
            est = stats.estimate("ratio", [1.0] * n, [math.exp(x) for x in logs[:n]], level=level)
            if stats.verdict(1.0, 0.0, "higher", est) != "inconclusive":
                wrong += 1
                break
    return wrong / sequences


def test_peeking_with_corrected_intervals_keeps_false_positives_at_or_below_5_percent():
    corrected = sequential.level(2, 10)               # 9 looks: each at 1 - 0.05 / 9
    assert corrected == pytest.approx(1 - 0.05 / 9)
    assert false_positive_rate(corrected) <= 0.05
    assert false_positive_rate(0.95) > 0.10           # the same peeking at plain 95% intervals


def test_the_decision_names_what_is_still_open():
    class C:
        def __init__(self, claim, metric, claimed, verdict):
            self.claim, self.metric, self.claimed, self.verdict = claim, metric, claimed, verdict

    open_ = [C("C3", "tokens_per_s", 2.2, "inconclusive"), C("C3", "comm_bytes_per_step", 0.875, "reproduced"),
             C("C3", "comm_exposed_s", None, "no claim")]
    assert sequential.decision(open_, 2, 4) == (False, "n=2: C3 tokens_per_s still inconclusive")
    assert sequential.decision(open_, 4, 4) == (True, "max repeats reached (n=4): C3 tokens_per_s still inconclusive")
    assert sequential.decision(open_[1:], 3, 4) == (True, "every verdict decided at n=3")


@pytest.mark.slow
def test_a_real_sweep_with_auto_repeats_stops_by_itself_and_says_why(tmp_path):
    from conftest import run_module

    result = run_module("ablate.sweeps", ["c3_no_sync", "--repeats", "auto", "--max-repeats", "3", "--dir",
                                          str(tmp_path), "--", "logger=none", "train.steps=6", "train.warmup_steps=2",
                                          "metrics.profile_steps=[3,2]", "metrics.gemm_probe_n=128"])
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "sequential.json").read_text())
    assert record["looks"][0] == 2 and record["level"] == pytest.approx(1 - 0.05 / 2)
    assert record["stopped"].startswith(("every verdict decided at n=", "max repeats reached (n=3)"))
    assert "look at n=2: " in result.stdout
    assert "**Repeats: auto** — " + record["stopped"] in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_a_sweep_killed_mid_run_continues_where_it_stopped_and_a_third_call_reruns_nothing(tmp_path):
    """kill -9 of the driver and its running child (a crash); the same command again keeps the finished
    runs, sets the broken one aside (never deleted) and runs it again; once more, it runs nothing."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    d = tmp_path / "D"
    cmd = [sys.executable, "-m", "ablate.sweeps", "aa_noise", "--repeats", "2", "--dir", str(d), "--",
           "logger=none", "train.steps=40", "metrics.gemm_probe_n=128"]
    driver = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while len(list(d.glob("aa_noise/*/summary.json"))) < 2 or not list(d.glob("aa_noise/003_*/metrics.jsonl")):
        assert driver.poll() is None and time.time() < deadline
        time.sleep(0.1)
    child = subprocess.run(["pgrep", "-f", f"hydra.run.dir={d}.*003_r1"],   # this D's: tests run side by side
                           capture_output=True, text=True).stdout.split()
    os.kill(driver.pid, signal.SIGKILL)
    for pid in child:
        os.killpg(int(pid), signal.SIGKILL)
    driver.wait()
    finished = {p: p.stat().st_mtime for p in d.glob("aa_noise/*/summary.json")}
    assert len(finished) == 2
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished in an earlier call: kept") == 2
    assert {p: p.stat().st_mtime for p in finished} == finished               # nothing finished run twice
    assert len(list(d.glob("aa_noise/*/summary.json"))) == 4
    assert list(d.glob("aa_noise/003_*.incomplete-1/metrics.jsonl"))         # the broken one kept, aside
    third = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and third.stdout.count("finished in an earlier call: kept") == 4
    other = subprocess.run(cmd[:5] + ["1"] + cmd[6:], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "holds another call's runs" in other.stderr
