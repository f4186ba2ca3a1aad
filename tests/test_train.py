"""Real training steps, each precision, and the run directory they leave."""
import json

import pytest

from conftest import read_jsonl, run_cli, run_in_process


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_each_precision_trains_and_the_loss_falls(tmp_path, precision):
    summary = run_in_process(tmp_path, [f"precision={precision}", "train.steps=20", "train.warmup_steps=2",
                                        "train.log_every=2", "metrics.gemm_probe_n=256", "metrics.predict=false"])
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


SUMMARY_KEYS = ("mfu", "hfu", "flops_per_token", "peak_flops", "peak_flops_source", "tokens_per_s",
                "tflops_per_device", "step_time_s", "data_wait_frac", "mem_peak_bytes", "mem_reserved_bytes",
                "fragmentation", "nonfinite_steps", "scaler_skipped_steps", "comm_bytes_per_step",
                "comm_calls_per_step", "gpu_util")


def test_summary_has_every_figure_or_says_why_not(tmp_path, fast):
    import torch

    summary = run_in_process(tmp_path, fast)
    for key in SUMMARY_KEYS:
        assert key in summary, key
        if summary[key] is None:
            assert summary["notes"].get(key), f"{key} is null without a reason"
    assert summary["comm_bytes_per_step"] == 0 and summary["comm_calls_per_step"] == 0   # one process
    if not torch.cuda.is_available():
        assert summary["peak_flops_source"] == "measured"
        # a peak probed while the machine was busy can read below the run's rate: MFU > 1 is then marked invalid
        if summary["mfu"] is None:
            assert "impossible" in summary["invalid"]["mfu"]["reason"]
        else:
            assert 0 < summary["mfu"] <= 1
        assert summary["fragmentation"] is None and "CUDA" in summary["notes"]["fragmentation"]
        assert summary["env"]["allocator"]["applicable"] is False
    assert summary["state_bytes"]["optimizer"] == 2 * summary["state_bytes"]["params"] + 4 * 21  # Adam m, v + steps
    assert_every_figure_has_its_unit(summary)


def assert_every_figure_has_its_unit(summary):
    """Every number of a real summary rendered once through the one units table (console, plan, report)."""
    from ablate import units

    rendered = {k: units.fmt(k, v) for k, v in summary.items() if isinstance(v, (int, float)) and v is not None}
    assert rendered["tokens_per_s"].endswith(" tok/s") and rendered["tokens_per_s_per_device"].endswith(" tok/s")
    assert rendered["step_time_s"].endswith(" s") and rendered["mem_peak_bytes"].endswith("B")
    assert rendered["data_wait_frac"].endswith("%")
    rates = {k: v for k, v in rendered.items() if k.endswith("_per_s")}
    assert rates and not [v for v in rates.values() if v.endswith(" s")], rates   # a rate is never a time


@pytest.mark.slow
def test_the_default_command_writes_a_run_dir_with_wandb_offline(tmp_path):
    from wandb_file import digest

    result = run_cli([f"hydra.run.dir={tmp_path}", "logger.group=g1", "logger.job_type=C9"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert summary["wandb"]["mode"] == "offline"
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert (tmp_path / "config.yaml").exists() and (tmp_path / ".hydra" / "overrides.yaml").exists()
    assert "ablate run" in result.stderr    # the summary table
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    logged = digest(run_file)
    assert logged["run"].run_group == "g1" and logged["run"].job_type == "C9"
    assert {"precision:fp32", "parallel:none", "model:tiny"} <= set(logged["run"].tags)
    assert {"model", "train", "precision", "parallel"} <= set(logged["config"])
    assert [json.loads(h["step"]) for h in logged["history"]] == [r["step"] for r in rows]
    assert json.loads(logged["summary"]["tokens_per_s"]) == pytest.approx(summary["tokens_per_s"])


def test_each_run_logs_library_output_to_its_own_log(tmp_path):
    """Runs one after another in one process (tests, a caller): a library's line goes to the current run's
    ablate.log only, through one handler."""
    import logging

    from ablate.console import route_library_logs

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    route_library_logs(first, 0)
    logging.getLogger("some.library").info("during the first run")
    route_library_logs(second, 0)
    logging.getLogger("some.library").info("during the second run")
    assert "during the second run" not in (first / "ablate.log").read_text()
    assert "during the second run" in (second / "ablate.log").read_text()
    assert sum(getattr(h, "ablate_run_log", False) for h in logging.getLogger().handlers) == 1


def test_torchs_own_warnings_go_to_the_run_log_not_the_console(tmp_path, capfd):
    """DTensor's redistribution warning (torch's logger has a stderr handler of its own) reached the console once
    per rank; it goes to ablate.log like every library's."""
    import logging

    import torch.distributed.tensor  # noqa: F401  (torch's logging sets up its loggers' handlers as a rank has them)

    from ablate.console import route_library_logs

    route_library_logs(tmp_path, 0)
    logging.getLogger("torch.distributed.tensor._redistribute").warning("2 sequential all_reduce operations")
    assert "sequential all_reduce" not in capfd.readouterr().err
    assert "sequential all_reduce" in (tmp_path / "ablate.log").read_text()


def test_the_printed_summary_names_the_mesh_and_a_bubble_the_schedule_dominates():
    """The console's lines from fixed summaries (in process, ~0 s)."""
    from ablate.console import bubble_note, mesh_line

    assert mesh_line({"mesh": {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "tp": 1},
                      "choices": {"parallel": "fsdp2"}}) == "mesh: dp_shard 4, parallel=fsdp2"
    hsdp = mesh_line({"mesh": {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1}, "choices": {"parallel": "hsdp"}})
    assert "the same layout as fsdp2 at this size" in hsdp
    assert mesh_line({"mesh": {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1}}) == "mesh: one rank"
    pipeline = {"pp_bubble_expected": 1 / 9, "pipeline": {"schedule": "1f1b", "action_s": 1.5e-3,
                                                           "overhead_s_per_action": 0.9e-3}}
    assert "dominates it" in bubble_note(pipeline) and "0.90 ms" in bubble_note(pipeline)
    pipeline["pipeline"]["overhead_s_per_action"] = 0.1e-3
    assert bubble_note(pipeline) == "expected 11.1% (1f1b)"
