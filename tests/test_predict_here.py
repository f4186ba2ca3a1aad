"""This machine's step, predicted (src/ablate/predict/here.py, collectives.py): the collectives a rank's free step
records against the comm model's bytes, the probe's interpolation on fixed figures, the plan's `--hardware here`
and its refusals. No timing is asserted: the model's error against runs is bench/predict_here.py's to say.
Cost: in process ~7 s; the spawned free steps (2 ranks, twice) ~15 s; a 2-rank run that probes gloo ~20 s (serial)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ablate import parallel
from ablate.compose import validate
from ablate.metrics.peak import locked, read_entries, write_entries
from ablate.model import build
from ablate.model.facts import measure
from ablate.parallel.comm_model import expected_comm
from ablate.predict import calls_of, collectives, here
from conftest import compose_cfg, launch_in_process, main_in_process

# each kind's figures on a line: latency 1 ms + 1 ms per MB after the short work, 3 ms + 2 ms per MB after the long
SHORT = {"work_s": 0.001, "all_reduce": [[n, 0.001 + n * 1e-9] for n in (1e3, 1e5, 1e6)]}
LONG = {"work_s": 0.011, "all_reduce": [[n, 0.003 + n * 2e-9] for n in (1e3, 1e5, 1e6)]}
TABLE = {2: {"costs": [SHORT, LONG]}}


def test_a_collectives_cost_is_latency_plus_bytes_fitted_and_interpolated_in_the_work_before_it():
    assert collectives.cost(TABLE, "all_reduce", 1e6, 2, 0.001) == pytest.approx(0.002)
    assert collectives.cost(TABLE, "all_reduce", 4e6, 2, 0.0) == pytest.approx(0.005)        # the line, beyond
    assert collectives.cost(TABLE, "all_reduce", 1e6, 2, 0.006) == pytest.approx(0.0035)     # halfway in work
    assert collectives.cost(TABLE, "all_reduce", 1e6, 2, 1.0) == pytest.approx(0.005)        # clamped
    noisy = [[1e3, 0.002], [1e5, 0.001], [1e6, 0.002]]   # not monotone: a line through them, not the points
    assert collectives.by_size(noisy, 1e5) == pytest.approx(collectives.by_size(noisy, 1e3), rel=0.1)


def test_measure_peak_drops_this_hosts_probes_and_keeps_the_others(tmp_path):
    import socket

    cache = tmp_path / "collectives.json"
    cache.write_text(json.dumps({f"{socket.gethostname()}|cpu|procs=2|group=2": {}, "otherhost|cpu|procs=2": {}}))
    assert collectives.forget_this_host(str(cache)) == 1
    assert list(json.loads(cache.read_text())) == ["otherhost|cpu|procs=2"]
    assert collectives.forget_this_host(str(tmp_path / "none.json")) == 0


def test_one_rank_is_predicted_from_its_own_free_step(capsys):
    from ablate import plan

    assert plan.main(["--json", "--hardware", "here", "train.batch_size=2", "train.seq_len=16"]) == 0
    p = json.loads(capsys.readouterr().out)["predicted"]
    assert p["step_time_s"] == pytest.approx(p["compute_s"]) and p["comm_s"] == {} and p["calls"] == {}
    assert p["tokens_per_s"] == pytest.approx(2 * 16 / p["step_time_s"]) and "here" in p["rate_source"]


@pytest.mark.parametrize("overrides,why", [
    (["parallel=fsdp2", "launcher.nproc_per_node=2", "parallel.pp=2"], "pipelines"),
    (["launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=1", "parallel=ddp"], "several nodes"),
    (["parallel=zero2", "launcher.nproc_per_node=2"], "DeepSpeed"),
])
def test_what_the_free_step_cannot_run_is_not_predicted_and_says_why(overrides, why):
    p = here.predict(validate(compose_cfg(overrides)))
    assert p["step_time_s"] is None and why in p["why"]


def test_the_advisor_is_not_run_on_this_machine_and_says_so(capsys):
    from ablate import plan

    assert plan.main(["--rank", "--hardware", "here"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rank --hardware here" in err and "h100_sxm" in err


@pytest.mark.slow
@pytest.mark.parametrize("overrides,dim", [
    (["parallel=fsdp2", "launcher.nproc_per_node=2"], "dp_shard"),
    (["parallel=ddp", "launcher.nproc_per_node=2", "train.grad_accum=2"], "dp_replicate"),
])
def test_a_ranks_free_step_makes_the_collectives_the_comm_model_counts(overrides, dim):
    """Each rank's step on a fake process group (spawned, 2 at once): the collectives it records are on the
    layout's dim and move the comm model's bytes (plus the gradient norm's few bytes under FSDP2)."""
    cfg = validate(compose_cfg(["train.batch_size=2", "train.seq_len=16", *overrides]))
    steps = here.free_steps(cfg, 2)
    assert [step[0] for step in steps] == [0, 1] and all(step[1] > 0 for step in steps)
    assert all(0 <= step[3]["own_cpu_s"] for step in steps)   # each rank's reading of the host over its steps
    calls = steps[0][2]
    assert {c.dim for c in calls} == {dim} and all(c.group == 2 for c in calls)
    n_params = sum(p.numel() for p in build(cfg.model, "meta").parameters())
    modeled = expected_comm(cfg, parallel.layout_of(cfg), n_params)[dim]
    assert sum(c.nbytes for c in calls if c.nbytes > 1024) == pytest.approx(modeled, rel=1e-3)   # (the norm's: less)
    blocks = measure(cfg).blocks["count"]   # and as many calls as the network model prices the latency of
    assert len(calls) == calls_of(cfg, parallel.layout_of(cfg), {dim: modeled}, blocks)[dim]


def test_a_sweeps_arms_are_predicted_before_they_run_and_reported_beside_their_steps(tmp_path):
    """`ablate.sweeps --predict`'s part (predict_arms: each distinct arm once, into D/predictions.json, beside the
    plan claim_dir writes) and the report's table that reads it (report/predicted.py), on stand-in runs: the
    measured steps are given, not timed. In process, ~3 s (aa_noise's two one-rank arms, predicted)."""
    from types import SimpleNamespace

    from ablate.report import predicted
    from ablate.sweeps import allocation, plan_runs
    from ablate.sweeps.__main__ import predict_arms
    from ablate.sweeps.runner import claim_dir

    runs = plan_runs(["aa_noise"], ["train.batch_size=2", "train.seq_len=16"], 2, None, 0)
    assert claim_dir(tmp_path, runs) == ""
    predict_arms(tmp_path, runs, allocation.configs(runs))
    made = json.loads((tmp_path / predicted.PREDICTIONS_FILE).read_text())
    assert len(made) == 2 and all(p["step_time_s"] > 0 for p in made.values())   # two arms, two repeats each

    def run(i: int, arm: str, step_s: float):
        return SimpleNamespace(path=tmp_path / "aa_noise" / f"{i:03d}_r0_{arm}", summary={},
                               metric=lambda key: step_s if key == "step_time_s" else None)
    arms = {"baseline": SimpleNamespace(value="a", runs=[run(1, "a", 0.010)]),
            "treatment": SimpleNamespace(value="b", runs=[run(2, "b", 0.030)])}
    lines = predicted.section(SimpleNamespace(arms=arms))
    table = [line for line in lines if line.startswith("| baseline") or line.startswith("| treatment")]
    assert len(table) == 2 and all(" s [" in line and "| x" in line for line in table)
    assert "pairs of arms whose measured steps do not overlap" in lines[-1]
    gpu = SimpleNamespace(path=tmp_path / "elsewhere", summary={"predicted": {"step_time_s": 0.5}}, metric=None)
    assert predicted.of_run(gpu) == 0.5   # a GPU run's own prediction comes first


def test_a_prediction_timed_on_a_busy_host_is_said_beside_what_it_expects():
    """A run's own prediction whose free steps shared the host with other work (its `host_load.busy`): the arm's
    row of the predicted table and a check that expects the predictions say so (on stand-in runs, ~0 s)."""
    from types import SimpleNamespace

    from ablate.report import predicted
    from ablate.report.conditions import predicted_busy_note

    def run(name: str, busy: bool):
        own = {"step_time_s": 0.1, "host_load": {"busy": busy, "other_cpu_frac": 0.6 if busy else 0.01}}
        return SimpleNamespace(path=Path(name), summary={"predicted": own},
                               metric=lambda key: 0.12 if key == "step_time_s" else None)
    runs = [run("001_a", True), run("002_b", False)]
    arms = {"baseline": SimpleNamespace(value="a", runs=runs[:1]), "treatment": SimpleNamespace(value="b",
                                                                                                runs=runs[1:])}
    table = "\n".join(predicted.section(SimpleNamespace(arms=arms)))
    assert "(1 predicted on a busy host)" in table and table.count("busy host") == 1
    note = predicted_busy_note({"metric": "tokens_per_s", "expected": "modeled"}, runs)
    assert note.startswith("1/2 runs' predictions timed on a busy host") and "001_a (60%)" in note
    assert predicted_busy_note({"metric": "tokens_per_s"}, runs) == ""


def test_a_run_predicts_its_own_step_before_its_first(tmp_path, monkeypatch):
    """The default run, in process (~4 s): summary.json's `predicted` is the step it timed with free collectives
    before its first step, with an MFU against its calibrated peak; its `modeled` tokens/s (a check's expected here)
    is that prediction's."""
    assert main_in_process(monkeypatch, ["logger=none", "train.steps=6", "train.warmup_steps=2",
                                         "metrics.gemm_probe_n=128", f"hydra.run.dir={tmp_path}"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    p = s["predicted"]
    assert p["step_time_s"] > 0 and 0 < p["mfu"] < 1 and p["compute_s_by_rank"] == [p["compute_s"]]
    assert s["modeled"]["tokens_per_s"] == p["tokens_per_s"] and "predicted" not in s["notes"]
    assert 0 <= p["host_load"]["other_cpu_frac"] <= 1 and isinstance(p["host_load"]["busy"], bool)


@pytest.mark.slow
@pytest.mark.serial
def test_two_ranks_probe_gloo_themselves_and_predict_the_collectives_they_then_make(tmp_path):
    """fsdp2 on 2 real ranks with no probe of 2 processes in this host's cache (~20 s: the probe ~10 s; serial, as
    the probe times collectives): the ranks probe gloo themselves before their first step and cache it; the
    prediction costs as many collectives on dp_shard as the run then counts."""
    cache = Path(os.environ["ABLATE_CACHE_DIR"]) / "collectives.json"
    with locked(cache):
        entries = read_entries(cache)
        entries.pop(collectives.key(2, 2), None)
        write_entries(cache, entries)
    assert launch_in_process(["parallel=fsdp2", "launcher.nproc_per_node=2", "logger=none", "train.steps=6",
                              "train.warmup_steps=2", "metrics.gemm_probe_n=128", f"hydra.run.dir={tmp_path}"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    p = s["predicted"]
    assert p["calls"] == {"dp_shard": s["comm_calls_per_step"]} and p["comm_s"]["dp_shard"] > 0
    assert len(p["compute_s_by_rank"]) == 2
    assert p["step_time_s"] == pytest.approx(p["compute_s"] + p["comm_s"]["dp_shard"])
    assert "(the run's)" in read_entries(cache)[collectives.key(2, 2)]["how"] and "(the run's)" in p["probes"]["2"]


def test_a_call_past_the_small_sizes_costs_what_the_large_ones_measured_and_calibrate_reads_its_bandwidth_there():
    """Past the caches a byte costs more: the small sizes' line (1 ms + 1 ns a byte) holds to 4 MB; at 16 and 32 MB
    the probe's own figures, a line between them, and on past 32 MB with its slope. calibrate's bus bandwidth is
    the one at the run's mean call, its latency a base and a hop per ring step through its layout's group sizes
    (fixed figures, in process)."""
    from ablate.calibrate import collective_figures, ring_latency

    mb = 1 << 20
    points = [[n, 1e-3 + n * 1e-9] for n in collectives.SMALL] + [[16 * mb, 0.030], [32 * mb, 0.070]]
    line_at_4 = 1e-3 + 4 * mb * 1e-9
    assert collectives.by_size(points, 2 * mb) == pytest.approx(1e-3 + 2 * mb * 1e-9)
    assert collectives.by_size(points, 10 * mb) == pytest.approx(line_at_4 + (0.030 - line_at_4) / 2)
    assert collectives.by_size(points, 16 * mb) == pytest.approx(0.030)
    assert collectives.by_size(points, 40 * mb) == pytest.approx(0.070 + 0.040 / 2)
    entry = {"costs": [{"work_s": 0.001, **{kind: points for kind in collectives.KINDS}}]}
    small = collective_figures(entry, 2, 1 * mb)["busbw"]
    large = collective_figures(entry, 2, 32 * mb)["busbw"]
    assert collective_figures(entry, 2, 32 * mb)["latency"]["base"] == pytest.approx(1e-3)   # the small sizes' line
    assert small["all_reduce"] == pytest.approx(1.0 / 1e-9)                    # 2(n-1)/n = 1 for two ranks
    assert large["all_gather"] == pytest.approx(0.5 * 32 * mb / (0.070 - 1e-3))  # (n-1)/n x bytes / (time - latency)
    # a layout of groups of 2 and of 4 (1 ms and 3 ms a call): a base and a hop per ring step through the two
    slower = [[n, 3e-3 + n * 1e-9] for n in collectives.SMALL]
    hop, after = ring_latency({2: entry, 4: {"costs": [{"work_s": 0.001, **{k: slower for k in collectives.KINDS}}]}},
                              1 * mb)
    assert hop == pytest.approx(1e-3) and after == {0.001: pytest.approx(0.0)}   # 0 + (n - 1) x 1 ms
    assert ring_latency({2: entry}, 1 * mb) == (0.0, {0.001: pytest.approx(1e-3)})
