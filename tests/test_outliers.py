"""Numbers under contention (#21): outliers named with the verdict both ways, stalls recorded, reruns
paired in place, noise floors with an address, and MFU against one peak — on planted run dirs."""
import json

import pytest

from ablate import report
from ablate.report import outliers
from test_report import fake_run

AA = {"name": "aa_noise", "claim": "A/A", "technique": "identical arms", "knob": "sweep.arm", "baseline": "a",
      "treatment": "b", "noise_floor": True,
      "checks": [{"metric": "tokens_per_s", "effect": "ratio", "claimed": None}]}


def aa_run(root, name, arm, repeat, step_s, **summary):
    tokens = 1000 / step_s
    return fake_run(root, name, {"sweep": {"arm": arm}, "model": {"name": "tiny"}, "train": {"batch_size": 8}},
                    {**AA, "repeat": repeat, "arm": arm}, step_time_s=step_s, tokens_per_s=tokens, **summary)


def planted(root, slow=None, stall=None, off=None):
    """4 repeats per arm at ~10 ms a step (+-1%); `slow` = (arm, repeat) runs 3x slower; `stall` likewise
    keeps its median but records a 10 s stall; `off` likewise ran on a machine 25% under its calibrated speed."""
    jitter = [1.00, 1.01, 0.99, 1.005]
    for r in range(4):
        for arm in ("a", "b"):
            step = 0.010 * jitter[r] * (3.0 if (arm, r) == slow else 1.0)
            extra = {"stalls": [{"step": 51, "seconds": 10.2, "x_median": 1020.0}], "stall_s": 10.19,
                     "tokens_per_s_wall": 500.0} if (arm, r) == stall else {}
            if (arm, r) == off:
                extra["machine_speed"] = {"start_ratio": 0.75, "end_ratio": 0.8, "off": True}
            aa_run(root, f"{r}_{arm}", arm, r, step, **extra)


def test_a_slow_run_is_named_and_the_verdict_is_given_without_it(tmp_path):
    planted(tmp_path, slow=("b", 2))
    built = report.build([tmp_path])
    assert list(built.outliers) == [str(tmp_path / "2_b")]
    assert "x2.96 slower than the median of its arm's other 3 runs" in built.outliers[str(tmp_path / "2_b")]
    speed = built.checks[0]
    assert speed.outliers == "2_b"
    assert speed.other_way.startswith("without the outlier runs' pairs: ") and "(n=3)" in speed.other_way
    assert report.main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "**Outliers and stalls**" in md and f"`{tmp_path / '2_b'}` (aa_noise, b): outlier" in md
    assert "other way" in md and "modified z-score" in md


def test_two_runs_or_a_spread_arm_name_no_outlier():
    runs = [outliers.R.Run(outliers.R.Path(f"/r{i}"), {"step_time_s": t}, {}) for i, t in enumerate((1.0, 3.0))]
    assert outliers.in_arm(runs) == {}                      # with two, nobody can say which one is off
    spread = [outliers.R.Run(outliers.R.Path(f"/s{i}"), {"step_time_s": t}, {})
              for i, t in enumerate((1.0, 1.6, 2.5, 4.0))]
    assert outliers.in_arm(spread) == {}                    # a loaded machine's spread, no single odd one


def test_a_stall_is_recorded_named_and_moves_the_interval_little(tmp_path):
    planted(tmp_path, stall=("a", 1))
    built = report.build([tmp_path])
    assert built.outliers == {}                           # its median step is like the others'
    speed = built.checks[0]
    assert 0.97 < speed.ci_low <= speed.ci_high < 1.03
    report.main([str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    assert "1 stall(s): step 51 (10.2 s, x1020 the median step)" in md and "wall-clock tokens/s 500" in md


def test_a_rerun_is_paired_in_the_outliers_place_and_the_original_kept(tmp_path):
    planted(tmp_path, slow=("b", 2))
    rerun = aa_run(tmp_path, "2_b_rerun", "b", 2, 0.0101, rerun_of="2_b")
    summary = json.loads((tmp_path / "2_b" / "summary.json").read_text())
    (tmp_path / "2_b" / "summary.json").write_text(json.dumps({**summary, "rerun_as": rerun.name,
                                                               "outlier": "x3.00 slower"}))
    built = report.build([tmp_path])
    group = built.groups[0]
    assert str(tmp_path / "2_b") not in [str(r.path) for r in group.arms["treatment"].runs]
    assert str(rerun) in [str(r.path) for r in group.arms["treatment"].runs]
    assert built.outliers == {}
    speed = built.checks[0]
    assert speed.outliers == "2_b" and speed.other_way.startswith("with the outlier runs instead of their reruns")
    assert 0.97 < speed.ci_low <= speed.ci_high < 1.03          # the rerun agrees with its arm
    report.main([str(tmp_path)])
    assert "rerun as `2_b_rerun`, which is paired in its place" in (tmp_path / "report.md").read_text()


def test_the_aa_floor_is_kept_per_host_and_workload_with_its_address_never_from_an_outlier(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    clean, spoiled = tmp_path / "clean", tmp_path / "spoiled"
    planted(clean)
    floor = report.build([clean]).noise_floor
    assert floor["from"] == "these runs" and floor["dir"] == str(clean.resolve())
    assert floor["workload"].startswith("tiny b8") and floor["measured"][:2] == "20"
    cached = json.loads((tmp_path / "cache" / "noise_floor.json").read_text())
    assert list(cached) == [f"{floor['host']}|{floor['workload']}"]
    planted(spoiled, stall=("a", 0))
    again = report.build([spoiled]).noise_floor
    assert "not cached: 1 run(s) with an outlier, a stall or a machine off its calibrated speed: 0_a" in again["from"]
    planted(tmp_path / "off", off=("b", 1))   # the same rule as the report's notes: the machine, not the noise
    assert "calibrated speed: 1_b" in report.build([tmp_path / "off"]).noise_floor["from"]
    planted(tmp_path / "slow", slow=("a", 0))   # one pair x3 apart: an A/A interval too wide to give
    slow_floor = report.build([tmp_path / "slow"]).noise_floor
    assert "these runs' A/A gives no interval (n=4 too small" in slow_floor["from"]
    assert json.loads((tmp_path / "cache" / "noise_floor.json").read_text()) == cached   # never replaced
    other = tmp_path / "other"
    fake_run(other, "x", {"model": {"name": "8b"}}, tokens_per_s=1.0)
    fake_run(other, "y", {"model": {"name": "8b"}, "train": {"seed": 1}, "precision": {"name": "bf16"}},
             tokens_per_s=1.0)
    report.main([str(other)])
    header = (other / "report.md").read_text()
    assert f"in `{clean.resolve()}`" in header and "another workload than these runs'" in header
    assert f"for the workload {floor['workload']}" in header


def test_mfu_against_one_peak_compares_arms_as_speeds(tmp_path):
    sweep = {"name": "c4_bf16", "claim": "C4", "technique": "bf16", "knob": "precision.name", "baseline": "fp32",
             "treatment": "bf16", "checks": [{"metric": "mfu_common_peak", "effect": "ratio", "claimed": None},
                                             {"metric": "mfu", "effect": "ratio", "claimed": None}]}
    for r in range(3):   # bf16 runs at 0.5x fp32's speed on this CPU, but its own peak is 20x lower
        fake_run(tmp_path, f"{r}_fp32", {"precision": {"name": "fp32"}}, {**sweep, "repeat": r},
                 tokens_per_s_per_device=1000.0, flops_per_token=1e6, peak_flops=1e10, mfu=0.1)
        fake_run(tmp_path, f"{r}_bf16", {"precision": {"name": "bf16"}}, {**sweep, "repeat": r},
                 tokens_per_s_per_device=500.0, flops_per_token=1e6, peak_flops=5e8, mfu=1.0)
    by = {c.metric: c for c in report.build([tmp_path]).checks}
    assert by["mfu_common_peak"].measured == pytest.approx(0.5)    # the speed ratio
    assert by["mfu"].measured == pytest.approx(10.0)               # own peaks: not a speed ratio
    report.main([str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    assert "the baseline's (0.01 TFLOP/s)" in md and "mfu_common_peak" in md


@pytest.mark.slow
@pytest.mark.serial
def test_a_real_run_paused_mid_run_records_the_stall_and_keeps_its_steady_speed(tmp_path):
    """SIGSTOP for 3 s once steps are logged (as another job or a debugger would): the stall is in
    summary.json, and the median-step tokens/s stays near the run's own pace, unlike the wall figure."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "ablate", "logger=none", "train.steps=200", "train.log_every=5",
                             f"hydra.run.dir={run_dir}"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (run_dir / "metrics.jsonl").exists() or (run_dir / "metrics.jsonl").stat().st_size < 400:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(3)
    os.kill(proc.pid, signal.SIGCONT)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    planted = max(summary["stalls"], key=lambda s: s["seconds"])          # a loaded machine may add its own
    assert planted["seconds"] > 2.5 and planted["x_median"] > 10, summary["stalls"]
    assert summary["stall_s"] > 2.5
    assert summary["tokens_per_s"] > 1.2 * summary["tokens_per_s_wall"]
    assert summary["step_time_s"] < summary["step_time_p90_s"] * 1.0001 < planted["seconds"]
    assert "stall(s): step" in summary["notes"]["step_time_s"]


@pytest.mark.slow
@pytest.mark.serial
def test_the_sweep_reruns_an_outlier_once_for_real_and_the_report_pairs_the_rerun(tmp_path):
    """Three planted A/A runs per arm, one 3x slow; ablate.sweeps' rerun step runs that arm again for real."""
    import os

    from ablate.sweeps import runner

    root = tmp_path / "D"
    planted(root / "aa_noise", slow=("b", 2))
    slow = root / "aa_noise" / "2_b"
    done = {str(slow): ("aa_noise", ["+sweeps=aa_noise", "sweep.arm=b", "logger=none", "train.steps=12",
                                     "metrics.gemm_probe_n=128", "metrics.predict=false"], 2)}
    runner.rerun_outliers(root, done, {**os.environ, "WANDB_MODE": "offline"}, 300, None, None)
    rerun = root / "aa_noise" / "2_b_rerun"
    assert json.loads((slow / "summary.json").read_text())["rerun_as"] == "2_b_rerun"
    assert json.loads((rerun / "summary.json").read_text())["rerun_of"] == "2_b"
    runner.rerun_outliers(root, done, dict(os.environ), 300, None, None)   # once: never again
    assert not (root / "aa_noise" / "2_b_rerun_rerun").exists()
    group = report.build([root]).groups[0]
    assert [r.path.name for r in group.arms["treatment"].runs][2] == "2_b_rerun"
    assert group.replaced[str(rerun)].path == slow


@pytest.mark.slow
@pytest.mark.serial
def test_a_slowed_rank_is_named_the_straggler_though_ddp_evens_out_step_times(tmp_path):
    """Rank 1 sleeps 50 ms before each step (a planted step hook): both ranks' step times stay alike (the
    all-reduce waits for it), its work before the first collective does not, and it is named."""
    from conftest import run_cli
    from planted import planted

    result = run_cli(["parallel=ddp", "launcher.nproc_per_node=2", "train.steps=12", "train.warmup_steps=2",
                      "logger=none", "metrics.gemm_probe_n=128", "metrics.predict=false", f"hydra.run.dir={tmp_path}"],
                     env=planted(delay="1:0.05"))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    ranks = {r["rank"]: r for r in summary["per_rank"]}
    assert all(r["step_time_s"] and r["step_time_p90_s"] for r in ranks.values())
    assert ranks[1]["step_time_s"] < 1.5 * ranks[0]["step_time_s"]          # evened out by the all-reduce
    assert ranks[1]["compute_before_comm_s"] > ranks[0]["compute_before_comm_s"] + 0.03
    straggler = summary["straggler"]
    assert straggler["rank"] == 1 and straggler["slowdown"] > 1.2 and straggler["by"] == "compute_before_comm_s"
    assert "straggler: rank 1 on" in result.stderr


def test_the_report_names_each_arms_straggler(tmp_path):
    lagging = {"rank": 1, "host": "node2", "slowdown": 2.0, "seconds": 0.08, "others_s": 0.04,
               "by": "compute_before_comm_s"}
    for r in range(3):
        aa_run(tmp_path, f"{r}_a", "a", r, 0.01, straggler=lagging if r else None)
        aa_run(tmp_path, f"{r}_b", "b", r, 0.01, straggler=None)
    report.main([str(tmp_path)])
    md = (tmp_path / "report.md").read_text()
    assert "| straggler |" in md and "rank 1 (node2) up to x2.00 in 2/3 runs" in md


def test_a_damaged_noise_floor_cache_is_named_and_set_aside(tmp_path, monkeypatch, capsys):   # in process, ~1 s
    from ablate.report import noise

    monkeypatch.setenv("ABLATE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "noise_floor.json").write_text('{"host|tiny": {"half_wid')   # torn by a kill
    assert noise.cached() == {}
    said = capsys.readouterr().err
    assert "the noise-floor cache" in said and "cannot be read (JSONDecodeError" in said and ".damaged" in said
    assert (tmp_path / "cache" / "noise_floor.json.damaged").read_text().startswith('{"host|tiny"')
    assert not (tmp_path / "cache" / "noise_floor.json").exists()
