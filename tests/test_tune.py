"""ablate.tune and the objective a -m job returns: the space, pruning, the Pareto front and the verdict in
process; one real tune (2 runs pruned around, continued, then confirmed: ~60 s)."""
import csv
import json
from pathlib import Path

import pytest

from ablate.config import ConfigError
from ablate.tune import Trial, best_two, direction, pareto, parse_space, prune_reason
from conftest import run_module


def test_the_space_and_the_direction():
    assert parse_space(["parallel=ddp,fsdp2", "train.batch_size=8, 16"]) == {
        "parallel": ["ddp", "fsdp2"], "train.batch_size": ["8", "16"]}
    with pytest.raises(ConfigError, match="--space parallel=ddp: give KEY=V1,V2"):
        parse_space(["parallel=ddp"])
    assert direction("tokens_per_s") == "maximize" and direction("step_time_s") == "minimize"


def test_pareto_front_and_best_two_by_hand():
    trials = [Trial(0, ["a"], objective=100.0, mem_peak_bytes=1e9), Trial(1, ["b"], objective=150.0,
              mem_peak_bytes=2e9), Trial(2, ["c"], objective=90.0, mem_peak_bytes=1.5e9),
              Trial(3, ["d"], state="pruned")]
    assert [t.number for t in pareto(trials, maximise=True)] == [0, 1]   # 2 is slower and larger than 0
    assert [t.number for t in best_two(trials, maximise=True)] == [1, 0]


def test_what_cannot_fit_is_pruned_before_it_runs():
    assert prune_reason(["train.batch_size=4"], 1e9) is None
    reason = prune_reason(["train.batch_size=4096"], 1e9)
    assert reason.startswith("needs at least ") and "over the 1.0 GB budget" in reason


def test_a_multirun_job_returns_its_objective(tmp_path):
    from omegaconf import OmegaConf

    from hydra_plugins.ablate_launcher.fresh_process import job_result

    (tmp_path / "summary.json").write_text(json.dumps({"tokens_per_s": 1234.5, "step_time_s": 0.2}))
    cfg = OmegaConf.create({"metrics": {"objective": "step_time_s"}})
    assert job_result(0, tmp_path, cfg)[1] == 0.2
    assert job_result(0, tmp_path / "prepared", cfg)[1] is None   # a Slurm array point: no figures yet
    status, error = job_result(2, tmp_path / "missing", cfg)
    assert status.name == "FAILED" and "exited 2" in str(error)


@pytest.mark.slow
def test_a_tune_prunes_runs_continues_and_confirms(tmp_path):
    d = tmp_path / "tune"
    common = ["--space", "train.batch_size=2,4,4096", "--mem-budget-gb", "1", "--dir", str(d), "--", "logger=none",
              "train.steps=6", "train.warmup_steps=2", "metrics.gemm_probe_n=128"]
    first = run_module("ablate.tune", ["--trials", "2", *common])
    assert first.returncode in (0, 1), first.stderr[-2000:]   # 1: both trials pruned or failed (no winner)
    second = run_module("ablate.tune", ["--trials", "3", "--confirm", "3", *common])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "continuing the tune" in second.stdout
    rows = list(csv.DictReader((d / "tune.csv").open()))
    states = {r["overrides"]: r["state"] for r in rows}
    assert states == {"train.batch_size=2": "complete", "train.batch_size=4": "complete",
                      "train.batch_size=4096": "pruned"}
    assert "over the 1.0 GB budget" in next(r["reason"] for r in rows if r["state"] == "pruned")
    best = (d / "best.yaml").read_text().split()
    assert best[-1] in ("train.batch_size=2", "train.batch_size=4") and "logger=none" in best
    report = (d / "report.md").read_text()
    assert "**Confirmed** (3 more runs each): " in report   # the verdict itself is this host's noise
    assert (d / "tune.png").exists() and (d / "optuna.db").exists()
    assert len(list(Path(d, "confirm").glob("*/summary.json"))) == 6
