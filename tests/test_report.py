"""The report: repeats grouped (never dropped), unfinished runs named, verdicts with intervals, ad-hoc
comparisons, hardware refusal, and what the plots contain (read from the data written beside them);
then real sweeps end to end, through ablate.sweeps and through Hydra's -m."""
import csv
import json
from pathlib import Path

import pytest
import yaml

from ablate import report
from conftest import cli_in_process

SWEEP = {"name": "c3_no_sync", "claim": "C3", "technique": "DDP deferred reduction", "knob": "parallel.no_sync",
         "baseline": False, "treatment": True, "claimed_text": "87.5% less traffic",
         "checks": [{"metric": "comm_bytes_per_step", "effect": "reduction", "claimed": 0.875, "tolerance": 0.001,
                     "exact": True, "better": "equal"},
                    {"metric": "tokens_per_s", "effect": "ratio", "claimed": 2.2, "tolerance": 0.15},
                    {"metric": "fragmentation", "effect": "value_treatment", "claimed": 0.021, "gpu_only": True}]}
CPU = {"cpu_model": "Test CPU", "cpu_cores": 2}


def fake_run(root: Path, name: str, config: dict, sweep=None, provenance=CPU, **summary) -> Path:
    d = root / name
    d.mkdir(parents=True)
    base = {"device": "cpu", "device_name": "cpu", "world_size": 2, "provenance": provenance,
            "notes": {"fragmentation": "no CUDA device"}}
    if sweep:
        base["sweep"] = sweep
    (d / "summary.json").write_text(json.dumps({**base, **summary}))
    (d / "config.yaml").write_text(yaml.safe_dump({**config, **({"sweep": sweep} if sweep else {})}))
    return d


def c3_run(root, name, no_sync, repeat, seed=0, **summary):
    sweep = {**SWEEP, "repeat": repeat}
    return fake_run(root, name, {"parallel": {"name": "ddp", "no_sync": no_sync}, "train": {"seed": seed}},
                    sweep, **summary)


def test_repeats_are_grouped_paired_and_judged_with_an_interval(tmp_path):
    for r, (b, t) in enumerate([(100.0, 150.0), (100.0, 160.0), (100.0, 140.0)]):
        c3_run(tmp_path, f"{r}_sync", False, r, comm_bytes_per_step=800.0, tokens_per_s=b, fragmentation=None)
        c3_run(tmp_path, f"{r}_nosync", True, r, comm_bytes_per_step=100.0, tokens_per_s=t, fragmentation=None)
    (tmp_path / "9_crashed").mkdir()
    (tmp_path / "9_crashed" / "config.yaml").write_text("sweep: {}\n")
    built = report.build([tmp_path])
    assert [len(a.runs) for a in built.groups[0].arms.values()] == [3, 3]
    by = {c.metric: c for c in built.checks}
    comm, speed, frag = by["comm_bytes_per_step"], by["tokens_per_s"], by["fragmentation"]
    assert comm.exact and comm.measured == pytest.approx(0.875) and comm.verdict == "reproduced" and comm.n == 3
    assert speed.n == 3 and speed.measured == pytest.approx(1.5) and speed.ci_high < 2.05
    assert speed.verdict == "not reproduced"
    assert frag.verdict == "not measurable here" and "no CUDA device" in frag.reason
    assert built.unfinished == [tmp_path / "9_crashed"]


def test_seeds_swept_inside_a_sweep_become_repeats_not_lost(tmp_path):
    for seed in (0, 1):   # what `+sweeps=c3_no_sync train.seed=0,1` makes: two runs per arm, no repeat index
        for no_sync, nbytes in ((False, 800.0), (True, 100.0)):
            sweep = {k: v for k, v in SWEEP.items()}
            fake_run(tmp_path, f"{seed}_{no_sync}", {"parallel": {"no_sync": no_sync}, "train": {"seed": seed}},
                     sweep, comm_bytes_per_step=nbytes, tokens_per_s=100.0)
    (c,) = [c for c in report.build([tmp_path]).checks if c.metric == "comm_bytes_per_step"]
    assert c.n == 2


def test_plain_runs_are_compared_by_the_knob_their_configs_differ_in(tmp_path):
    for i, (prec, speed) in enumerate([("fp32", 100.0), ("bf16", 130.0), ("fp32", 104.0), ("bf16", 128.0)]):
        fake_run(tmp_path, f"run{i}", {"precision": {"name": prec}, "train": {"seed": i}}, tokens_per_s=speed,
                 mfu=0.1, mem_peak_bytes=1e6, data_wait_frac=0.01, comm_bytes_per_step=0.0, loss=2.0)
    built = report.build([tmp_path])
    (group,) = built.groups
    assert group.sweep["knob"] == "precision.name" and list(group.arms) == ["baseline", "treatment"]
    speed = next(c for c in built.checks if c.metric == "tokens_per_s")
    assert speed.verdict == "no claim" and speed.n == 2 and speed.measured == pytest.approx((1.3 + 128 / 104) / 2)


def test_a_checkpointing_grids_memory_verdict_is_its_peak_tensor_bytes(tmp_path, capsys):
    """Stand-in CPU runs of `-m model.activation_checkpointing=false,true sweep.repeat=0,1` (in process): the memory
    verdict is the peak tensor bytes' change with its interval, the saved activations beside it, the RSS a context
    figure; no week-4 arithmetic; the terminal's table names each row's arms."""
    for r, (ck, tensors, saved, rss) in enumerate([(False, 9.4e6, 6.7e6, 374e6), (True, 5.7e6, 1.5e6, 386e6)] * 2):
        fake_run(tmp_path, f"{r}_ck{ck}", {"model": {"activation_checkpointing": ck}, "sweep": {"repeat": r // 2}},
                 tokens_per_s=100.0, peak_bytes_measured=tensors * (1 + r / 100), activation_bytes=saved,
                 mem_peak_bytes=rss)
    built = report.build([tmp_path])
    by = {c.metric: c for c in built.checks}
    tensors, saved, rss = by["peak_bytes_measured"], by["activation_bytes"], by["mem_peak_bytes"]
    assert tensors.n == 2 and tensors.measured == pytest.approx(0.612, abs=0.002) and tensors.ci_low < tensors.ci_high
    assert "the memory verdict" in tensors.what and "context" in rss.what and saved.measured < 0.25
    assert built.arithmetic == []
    report.output.print_table(built)
    folded = "".join(ln.split("│")[2].strip() for ln in capsys.readouterr().out.splitlines() if ln.count("│") > 3)
    assert "model.activation_checkpointing=True vs False" in folded   # (the arms column, folded over its lines)


def test_a_directory_given_twice_is_counted_once(tmp_path):
    for r, (b, t) in enumerate([(100.0, 150.0), (100.0, 160.0)]):
        c3_run(tmp_path, f"{r}_sync", False, r, comm_bytes_per_step=800.0, tokens_per_s=b)
        c3_run(tmp_path, f"{r}_nosync", True, r, comm_bytes_per_step=100.0, tokens_per_s=t)
    twice = report.build([tmp_path, tmp_path, tmp_path / "0_sync"])
    assert len(twice.runs) == 4 and next(c for c in twice.checks if c.metric == "tokens_per_s").n == 2


def test_runs_from_different_hardware_are_not_paired_unless_asked(tmp_path):
    c3_run(tmp_path, "a", False, 0, comm_bytes_per_step=800.0, tokens_per_s=100.0)
    c3_run(tmp_path, "b", True, 0, provenance={"cpu_model": "Other CPU", "cpu_cores": 64},
           comm_bytes_per_step=100.0, tokens_per_s=100.0)
    comm = next(c for c in report.build([tmp_path]).checks if c.metric == "comm_bytes_per_step")
    assert comm.verdict == "not measurable here" and "different hardware" in comm.reason
    mixed = next(c for c in report.build([tmp_path], True).checks if c.metric == "comm_bytes_per_step")
    assert mixed.verdict == "reproduced"


def test_an_impossible_mfu_is_never_judged(tmp_path):
    sweep = {**SWEEP, "checks": [{"metric": "mfu", "effect": "ratio", "claimed": 1.0}]}
    fake_run(tmp_path, "a", {"parallel": {"no_sync": False}}, sweep, mfu=0.4)
    fake_run(tmp_path, "b", {"parallel": {"no_sync": True}}, sweep, mfu=None,
             invalid={"mfu": {"value": 3.46, "reason": "346% > 100% is impossible"}})
    (c,) = report.build([tmp_path]).checks
    assert c.verdict == "not measurable here" and "impossible" in c.reason


def test_expected_here_for_partitioning_and_what_the_plot_holds(tmp_path):
    sweep = {"name": "c2_zero3", "claim": "C2", "technique": "ZeRO-3", "knob": "parallel.name", "baseline": "ddp",
             "treatment": "zero3", "checks": [{"metric": "state_bytes_total", "effect": "reduction", "claimed": 0.984,
                                               "expected": "partition", "exact": True},
                                              {"metric": "mem_peak_bytes", "effect": "reduction", "claimed": 0.98,
                                               "gpu_only": True}]}
    for r in range(2):
        for par, total in (("ddp", 1600), ("zero3", 800), ("fsdp2", 800)):
            fake_run(tmp_path, f"{r}_{par}", {"parallel": {"name": par}}, {**sweep, "repeat": r}, mem_peak_bytes=5e8,
                     per_rank=[{"state_bytes": {"params": total // 4, "grads": total // 4, "optimizer": total // 2}}])
    assert report.main([str(tmp_path)]) == 0
    state = next(c for c in report.build([tmp_path]).checks if c.metric == "state_bytes_total")
    assert state.expected_here == 0.5 and state.measured == pytest.approx(0.5) and state.verdict == "reproduced"
    panels = json.loads((tmp_path / "c2_zero3.plot.json").read_text())["panels"]
    state_panel, mem_panel = panels
    assert [a["label"] for a in state_panel["arms"]] == ["ddp", "zero3", "fsdp2"]      # every arm drawn
    assert all(a["n"] == 2 and a["ci_low"] is not None for a in state_panel["arms"])    # error bars
    assert state_panel["claimed_line"] == pytest.approx(1600 * 0.5)   # the claim as the treatment's level
    assert mem_panel["greyed"] and mem_panel["reason"]                # not measurable: greyed, with why
    assert (tmp_path / "c2_zero3.png").stat().st_size > 1000
    md = (tmp_path / "report.md").read_text()
    assert "−50.0%" in md and "(exact, n=2)" in md and "Noise floor" in md
    assert "**reproduced** (vs expected here)" in md      # judged against 1 - 1/world, not the claimed -98.4%


def test_report_of_nothing_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "nothing to compare" in capsys.readouterr().err


@pytest.mark.slow
def test_hydra_multirun_with_a_repeat_axis_interleaves_the_arms(tmp_path, capsys):
    """The call's main() in this process (conftest.cli_in_process), its 4 jobs processes of their own."""

    result = cli_in_process(capsys, ["+sweeps=aa_noise", "sweep.repeat=0,1", "logger=none", "train.steps=4",
                                     "train.warmup_steps=1", "metrics.gemm_probe_n=128",
                                     "metrics.predict=false", f"hydra.sweep.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    dirs = sorted(tmp_path.glob("[0-9]*"), key=lambda p: int(p.name.split("_")[0]))
    order = [json.loads((d / "summary.json").read_text())["sweep"] for d in dirs]
    assert [(s["repeat"], s["arm"]) for s in order] == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert report.main([str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert rows and all(r["verdict"] != "reproduced" for r in rows)           # an A/A test claims nothing


def subprocess_run(args):
    import os
    import subprocess
    import sys

    from conftest import REPO

    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "WANDB_MODE": "offline"})


@pytest.mark.slow
def test_c5_records_each_arms_largest_batch_and_says_why_a_cpu_cannot_judge_it(tmp_path, capsys):
    """The sweep's driver in process (conftest.drive_in_process); its searches, trials and runs processes."""
    from ablate.sweeps.__main__ import main as sweeps_main
    from conftest import drive_in_process

    code = drive_in_process(sweeps_main, ["c5_expandable", "--dir", str(tmp_path), "--batch-search", "multiple_of=32",
                                          "--batch-search", "limit=32", "--", "logger=none",   # 1 trial per arm
                                          "train.steps=5", "train.warmup_steps=2", "metrics.gemm_probe_n=128",
                                          "metrics.predict=false"])
    assert code == 0, capsys.readouterr().err[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("c5_expandable/*/summary.json"))]
    assert len(summaries) == 2     # the searches' own runs and trials are not runs of the sweep
    for s in summaries:
        assert s["max_batch"] == 32 and s["max_batch_search"]["search"]["multiple_of"] == 32   # the option took
        assert s["max_batch_search"]["fit_rule"].startswith("peak RSS within 500.0 MB")
        assert Path(s["max_batch_search"]["dir"], "summary.json").exists()
    rows = {r["metric"]: r for r in csv.DictReader((tmp_path / "report.csv").open())}
    assert rows["max_batch"]["verdict"] == "not measurable here"
    assert "not the CUDA caching allocator" in rows["max_batch"]["reason"]


@pytest.mark.slow
def test_a_run_past_its_timeout_is_killed_named_and_the_sweep_goes_on(tmp_path):
    result = subprocess_run(["-m", "ablate.sweeps", "aa_noise", "--dir", str(tmp_path), "--run-timeout", "1",
                             "--", "logger=none"])
    assert result.returncode != 0
    assert result.stdout.count("FAILED (exit 124)") == 2          # both arms tried, each killed at 1 s
    assert "timed out after 1 s (--run-timeout)" in result.stderr
    assert "aa_noise sweep.arm=a r0; aa_noise sweep.arm=b r0" in result.stderr.splitlines()[-1]


def test_c1_tells_the_articles_mfu_under_each_convention(tmp_path):
    """The article's 60.6% is counted with 6N: the same throughput with each convention's FLOPs per token.
    With 6N = 700 and full attention = 800 FLOPs/token: 60.6% x 800/700 = 69.3%, causal 750: 64.9%."""
    sweep = {"name": "c1_mfu", "claim": "C1", "knob": "model.activation_checkpointing", "baseline": False,
             "treatment": True, "checks": [{"metric": "hw_flops_per_token", "effect": "ratio", "claimed": 1.333}]}
    conventions = {"6N": 700, "6N+attn_full": 800, "6N+attn_causal": 750, "8N_hardware": 800}
    for ckpt, hw in ((False, 800), (True, 1000)):
        fake_run(tmp_path, f"ckpt_{ckpt}", {"model": {"activation_checkpointing": ckpt}}, {**sweep, "repeat": 0},
                 hw_flops_per_token=hw, mfu_convention="6N+attn_full", seq_len=64,
                 mfu_conventions={k: {"flops_per_token": v, "mfu": None} for k, v in conventions.items()})
    assert report.main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "the article's 60.6% (6N) under each convention" in md
    assert "6N 60.6%, 6N+attn_full 69.3%, 6N+attn_causal 64.9%, 8N_hardware 69.3%" in md


def test_c6_expects_only_what_the_loader_can_deliver(tmp_path):
    """Naive steps of 10 ms, 40% of it waiting: hiding the wait leaves 6 ms of compute, x1.667. With 2 workers
    at 6 ms a batch the loader delivers 333 batches/s against the 167 the steps take: it keeps up. At 24 ms a
    batch it delivers 83/s, so a step takes at least 12 ms: expected x0.833, and the report says why."""
    def c6(latency_ms):
        root = tmp_path / f"lat{latency_ms}"
        sweep = {"name": "c6_pinned", "claim": "C6", "knob": "dataloader.name", "baseline": "naive",
                 "treatment": "pinned", "checks": [{"metric": "tokens_per_s", "effect": "ratio", "claimed": None,
                                                    "expected": "hidden_wait", "tolerance": 0.05}]}
        for r in range(2):
            for name, workers, tps in (("naive", 0, 1000), ("pinned", 2, 1600)):
                fake_run(root, f"{r}_{name}", {"dataloader": {"name": name, "num_workers": workers,
                                                              "read_latency_ms": latency_ms},
                                               "train": {"grad_accum": 1}}, {**sweep, "repeat": r},
                         step_time_s=0.010, data_wait_frac=0.4, tokens_per_s=tps + r)
        return report.build([root]).checks[0]

    fast = c6(6)
    assert fast.expected_here == pytest.approx(1 / 0.6) and "333 batches/s vs 167 batches/s" in fast.reason
    assert "keeps up" in fast.reason
    assert fast.verdict == "no claim" and "the interval misses the x1.67 expected here" in fast.reason   # 1.6 measured
    slow = c6(24)
    assert slow.expected_here == pytest.approx(0.010 / 0.012) and "cannot keep up" in slow.reason


def test_a_report_on_runs_that_did_not_finish_says_so(tmp_path, capsys):
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "config.yaml").write_text("train:\n  steps: 400\n")
    (killed / "metrics.jsonl").write_text('{"step": 2, "loss": 5.0}\n')
    assert report.main([str(tmp_path)]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith("ablate.report: error: nothing to compare: 1 run(s) did not finish (no summary.json): ")
    assert str(killed) in said and "train.resume=" in said and "\n" not in said


def test_a_truncated_summary_is_named_and_the_rest_reported(tmp_path, capsys):
    """A run's summary.json cut short (a full disk, a copy interrupted): one line naming the file, the other
    runs' verdicts as before, no traceback. In process, ~1 s."""
    for r, (b, t) in enumerate([(100.0, 150.0), (100.0, 160.0)]):
        c3_run(tmp_path, f"{r}_sync", False, r, comm_bytes_per_step=800.0, tokens_per_s=b, fragmentation=None)
        c3_run(tmp_path, f"{r}_nosync", True, r, comm_bytes_per_step=100.0, tokens_per_s=t, fragmentation=None)
    cut = c3_run(tmp_path, "2_nosync", True, 2, comm_bytes_per_step=100.0, tokens_per_s=150.0) / "summary.json"
    cut.write_text(cut.read_text()[:40])
    built = report.build([tmp_path])
    assert [len(a.runs) for a in built.groups[0].arms.values()] == [2, 2]
    assert {c.metric: c for c in built.checks}["comm_bytes_per_step"].verdict == "reproduced"
    warned = [line for line in capsys.readouterr().err.splitlines() if str(cut) in line]
    assert len(warned) == 1 and "cannot be read" in warned[0] and "left out" in warned[0]


def test_a_corrupt_plan_of_a_sweep_dir_is_one_line_and_exit_2(tmp_path, capsys):
    """ablate.sweeps on a --dir whose plan.json is damaged: nothing says which runs are this call's, so it
    refuses in one line (exit 2) and touches nothing. In process, ~1 s."""
    from ablate.sweeps.__main__ import main

    (tmp_path / "plan.json").write_text('[{"sweep": "aa_noi')
    assert main(["aa_noise", "--dir", str(tmp_path), "--", "logger=none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan.json cannot be read" in err and "choose another folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
