"""Real training steps, each precision, and the run directory they leave."""
import json

import pytest

from conftest import read_jsonl, run_cli, run_in_process


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_each_precision_trains_and_the_loss_falls(tmp_path, precision):
    summary = run_in_process(tmp_path, [f"precision={precision}", "train.steps=20", "train.warmup_steps=2",
                                        "train.log_every=2", "metrics.gemm_probe_n=256"])
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(2, 21, 2))
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5
    assert summary["nonfinite_steps"] == 0
    assert summary["tokens_per_s"] > 0 and summary["step_time_s"] > 0
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["measured_steps"] == 18 and saved["choices"]["precision"] == precision
    if precision == "fp16":
        assert saved["loss_scale"] is not None


def test_grad_accum_and_variable_lengths(tmp_path, fast):
    summary = run_in_process(tmp_path, [*fast, "train.grad_accum=3", "train.seq_len_min=16"])
    assert summary["measured_tokens"] < 4 * 3 * 8 * 64   # shorter batches than the maximum
    assert summary["flops_per_token"] > 0


def test_same_seed_same_losses(tmp_path, fast):
    a = run_in_process(tmp_path / "a", fast)
    b = run_in_process(tmp_path / "b", fast)
    assert a["loss"] == b["loss"]


@pytest.mark.slow
def test_the_default_command_writes_a_run_dir_with_wandb_offline(tmp_path):
    result = run_cli([f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert summary["wandb"]["mode"] == "offline"
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert (tmp_path / "config.yaml").exists() and (tmp_path / ".hydra" / "overrides.yaml").exists()
    assert "ablate run" in result.stderr    # the summary table
