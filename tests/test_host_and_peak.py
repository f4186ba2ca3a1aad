"""Numbers that compare across runs and sweeps (#32): one measured peak per host, and the host's load beside
every speed figure. In process, hand-checked; one real run beside a busy process (~5 s)."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ablate.metrics import host
from ablate.metrics.peak import forget_this_host, measured_peak, peak_key
from ablate.report.conditions import busy_note, machine_note
from conftest import main_in_process


def test_the_peak_is_kept_until_the_software_changes_or_asked_again(tmp_path):
    cache = str(tmp_path / "peak.json")
    first = measured_peak(torch.device("cpu"), "cpu", torch.float32, 64, cache)
    entries = json.loads(Path(cache).read_text())
    entries[first["key"]]["measured_unix"] -= 30 * 24 * 3600     # a month old: still this host's peak
    Path(cache).write_text(json.dumps(entries))
    assert measured_peak(torch.device("cpu"), "cpu", torch.float32, 64, cache)["reused"]
    again = measured_peak(torch.device("cpu"), "cpu", torch.float32, 64, cache, measure=True)
    assert not again["reused"] and "load_1min" in again
    assert f"torch={torch.__version__}" in peak_key("cpu", torch.float32, 64)   # a torch upgrade: a new peak
    assert forget_this_host(cache) == 1 and json.loads(Path(cache).read_text()) == {}


def test_other_cpu_share_by_hand():
    ranks = [{"host": "a", "own_cpu_s": 3.0, "host_busy_s": 10.0, "host_total_s": 20.0},
             {"host": "a", "own_cpu_s": 3.0, "host_busy_s": 10.0, "host_total_s": 20.0},
             {"host": "b", "own_cpu_s": 9.0, "host_busy_s": 9.0, "host_total_s": 20.0}]
    load = host.summarize(0.5, ranks, "a")
    assert load["other_cpu_frac"] == pytest.approx((10 - 6) / 20) and not load["busy"]    # 0.2 < 0.25
    busy = host.summarize(0.5, [{**ranks[0], "host_busy_s": 14.0}], "a")
    assert busy["other_cpu_frac"] == pytest.approx(0.55) and busy["busy"]
    assert host.summarize(None, [{"host": "a", "host_busy_s": None}], "a")["reason"] == host.NOT_LINUX


def test_the_report_says_when_runs_were_on_a_busy_host():
    def run(name, frac):
        return SimpleNamespace(path=Path(name), summary={"host_load": {"other_cpu_frac": frac,
                                                                      "busy": frac >= host.BUSY_FRAC}})
    runs = [run("a", 0.05), run("b", 0.6)]
    assert busy_note({"metric": "tokens_per_s"}, runs).startswith("1/2 runs on a busy host (other processes' "
                                                                   "share of the CPU: b (60%))")
    assert busy_note({"metric": "comm_bytes_per_step", "exact": True}, runs) == ""   # counts do not depend on it


def test_the_report_names_runs_whose_machine_was_off_its_calibrated_speed():
    """In process (~0 s): summary.json's machine_speed (metrics/machine_speed.py, the GEMM probe before the first
    step and after the last against the host's calibration); a run more than 10% off either way is named."""
    def run(name, start, end):
        return SimpleNamespace(path=Path(name), summary={"machine_speed": {
            "start_ratio": start, "end_ratio": end, "off": abs(start - 1) > 0.1 or abs(end - 1) > 0.1}})
    runs = [run("a", 0.97, 1.04), run("slow", 0.66, 0.71), run("fast", 1.02, 1.18)]
    assert machine_note({"metric": "tokens_per_s"}, runs) == (
        "2/3 runs on a machine more than 10% off its calibrated speed (slow (x0.66), fast (x1.18)): timings there "
        "measure the machine as much as the change")
    assert machine_note({"metric": "comm_bytes_per_step", "exact": True}, runs) == ""


@pytest.mark.slow
@pytest.mark.xdist_group("trained")   # reads a shared `trained` run
def test_every_run_probes_its_machine_before_and_after(trained):
    speed = trained("none", "fp32", 1, "train.grad_accum=2")[0]["machine_speed"]
    assert speed["calibration_flops"] > 0 and speed["start_flops"] > 0 and speed["end_flops"] > 0
    assert speed["start_ratio"] == pytest.approx(speed["start_flops"] / speed["calibration_flops"])
    assert speed["off"] == any(abs(speed[k] - 1) > 0.1 for k in ("start_ratio", "end_ratio"))
    # a bf16 run's on a CPU: float32's products (bf16's took 31 s a probe here), against float32's calibration
    bf16 = trained("none", "bf16", 1)[0]["machine_speed"]
    assert "float32 products" in bf16["probe"] and bf16["start_ratio"] > 0


def test_a_run_beside_a_busy_process_says_the_host_was_busy(tmp_path, monkeypatch):
    # another user's process, not a child of this one (a child would count as the run's own, like its loader
    # workers): started through a shell that leaves it behind
    pid = int(subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True).stdout)
    try:
        code = main_in_process(monkeypatch, ["logger=none", "train.steps=20", "train.warmup_steps=2",
                                             "metrics.gemm_probe_n=128",
                                             "metrics.predict=false", f"hydra.run.dir={tmp_path}"])
    finally:
        os.kill(pid, signal.SIGKILL)
    assert code == 0
    load = json.loads((tmp_path / "summary.json").read_text())["host_load"]
    assert load["other_cpu_frac"] >= 0.3 and load["busy"], load


def test_more_repeats_extend_a_sweeps_dir_and_fewer_are_refused(tmp_path):
    """ablate.sweeps NAME --repeats 2 --dir D on a D of --repeats 1: the earlier runs keep their places."""
    from ablate.sweeps.runner import PLAN_FILE, claim_dir

    def plan(repeats):
        return [("c3_no_sync", [f"parallel={p}"], r) for r in range(repeats) for p in ("ddp_sync", "ddp")]
    assert claim_dir(tmp_path, plan(1)) == ""
    assert claim_dir(tmp_path, plan(2)) == ""
    assert len(json.loads((tmp_path / PLAN_FILE).read_text())) == 4
    said = claim_dir(tmp_path, plan(1))
    assert "its plan.json is another call's plan (4 runs there, 2 here" in said, said
    (tmp_path / PLAN_FILE).write_text(json.dumps([{"sweep": "c3_no_sync", "overrides": ["parallel=ddp"], "repeat": 0}]))
    assert 'run 1 there is {"sweep": "c3_no_sync", "overrides": ["parallel=ddp"]' in claim_dir(tmp_path, plan(1))


def test_a_finished_run_that_is_not_the_plans_is_set_aside_and_run_again(tmp_path):   # in process, ~0 s
    """A sweep dir's run whose config.yaml says parallel=ddp where the plan has ddp_sync (put there by hand): named
    on its line, set aside (the report skips it), run again; the plan's own finished run is kept."""
    import yaml

    from ablate.report.runs import find
    from ablate.sweeps.runner import resume_point

    run = tmp_path / "c3_no_sync" / "001_r0_parallel-ddp_sync"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"parallel": {"name": "ddp"}, "train": {"steps": 12},
                                                     "optim": {"lr": 0.0003}, "sweep": {"repeat": 0}}))
    (run / "summary.json").write_text(json.dumps({"kind": "run", "steps": 12}))
    plan = ["parallel=ddp_sync", "+sweeps=c3_no_sync", "optim.lr=3e-4", "train.steps=12"]
    said = resume_point(run, plan, 0)
    assert said == ("finished in an earlier call, but its config.yaml has parallel=ddp where the plan has ddp_sync: "
                    "set aside as 001_r0_parallel-ddp_sync.other-1, and run again"), said
    assert not run.exists() and find([tmp_path]) == ([], [])
    aside = run.with_name(run.name + ".other-1")
    aside.rename(run)
    assert resume_point(run, ["parallel=ddp", "optim.lr=3e-4", "train.steps=12"], 0) == \
        "finished in an earlier call: kept"


def test_an_invalid_figure_feeds_nothing_and_says_why():
    """A run faster than its own peak has an invalid mfu (summary.json): it is no figure, and the common peak
    taken from such a run makes every mfu_common_peak invalid too, with the reason."""
    from ablate.report import runs as R

    def run(name, mfu_invalid):
        summary = {"peak_flops": 1e11, "tokens_per_s_per_device": 1000.0, "flops_per_token": 1e8, "mfu": None,
                   "invalid": {"mfu": {"value": 1.21, "reason": "121% > 100% is impossible"}} if mfu_invalid else {}}
        return R.Run(Path(name), summary, {})
    base, treat = run("base", True), run("treat", False)
    assert base.metric("mfu") is None and base.invalid("mfu") == "121% > 100% is impossible"
    R.common_peak([base, treat], [base])
    assert treat.metric("mfu_common_peak") is None
    assert "is below what base achieved" in treat.invalid("mfu_common_peak")
    R.common_peak([base, treat], [treat])   # a sound reference: the figure is there
    assert treat.metric("mfu_common_peak") == pytest.approx(1.0)
