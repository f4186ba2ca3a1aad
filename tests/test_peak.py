"""The peak a run holds: planned (model/peak.py) against measured (metrics/step_memory.py) on the session's shared
runs (no run of its own), the 70B plan of the issue, and pruning by the peak (tune, maxbatch) in process.
Cost: ~20 s (two 70B plans on fake tensors at 8k tokens, ~7 s each; the pruning in process, ~1 s)."""
import json

import pytest

from ablate.metrics.step_memory import tracked_step
from conftest import compose_cfg, run_module

GIB = 2 ** 30


def typed(overrides):
    from ablate.compose import validate

    return validate(compose_cfg(["logger=none", *overrides]))


@pytest.mark.slow
@pytest.mark.xdist_group("trained")   # shares the `trained` runs (one rank, fsdp2 bf16 on 2, hsdp 2x2, fsdp2 x tp2)
@pytest.mark.parametrize("run, within", [
    (("none", "fp32", 1, "train.grad_accum=2"), 0.10), (("fsdp2", "bf16", 2), 0.10),
    (("hsdp", "fp32", 4, "parallel.shard_size=2"), 0.10),
    # tensor parallelism's gathered sequences (b x s x d per collective) are not planned: on the tiny model, whose
    # peak is mostly activations, measured 5.07 MB against 4.41 planned (x1.15); model=small: bench/peak_matrix.py
    (("fsdp2", "fp32", 4, "parallel.tp=2"), 0.20)])
def test_the_planned_peak_is_near_the_measured_one(trained, run, within):
    summary, _ = trained(*run)
    measured, planned = summary["peak_bytes_measured"], summary["peak_bytes_planned"]
    assert measured and planned and summary["peak_ratio"] == pytest.approx(measured / planned)
    assert abs(summary["peak_ratio"] - 1) <= within, (run, measured, planned)
    assert summary["modeled"]["peak_bytes_measured"] == planned   # the report's "expected here"
    assert {"params", "optimizer"} <= set(summary["peak_parts_measured"])
    assert max(r["peak_bytes_measured"] for r in summary["per_rank"]) == measured


def test_the_tracked_step_is_a_warm_up_step_or_one_left_out():
    assert tracked_step(0, first_measured=6, steps=20) == 5       # the last warm-up step
    assert tracked_step(0, first_measured=2, steps=20) == 2       # the second, then left out of the figures
    assert tracked_step(10, first_measured=12, steps=20) == 12    # a resume: its own second step
    assert tracked_step(0, first_measured=2, steps=2) is None     # none to spare: the only measured step


@pytest.mark.slow   # two `python -m ablate.plan` processes
def test_the_70b_layout_fits_80_gib_only_with_a_vocab_parallel_loss(tmp_path):
    """The issue's 70B on 256 GPUs (fsdp2 x tp8, batch 16 x 8k, full checkpointing): below 80 GiB with the
    vocab-parallel loss, and more than 50 GiB above that with the logits gathered whole."""
    args = ["--json", "model=70b", "launcher=slurm", "launcher.nodes=32", "launcher.nproc_per_node=8",
            "parallel=fsdp2", "parallel.tp=8", "precision=bf16", "train.batch_size=16", "train.seq_len=8192",
            "model.max_seq_len=8192", "model.activation_checkpointing=full"]
    peaks = {}
    for extra in ([], ["parallel.loss_parallel=false"]):
        result = run_module("ablate.plan", args + extra, timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        plan = json.loads(result.stdout)
        assert plan["peak_bytes"] == pytest.approx(plan["peak_tensor_bytes"] + plan["peak_allowance"])
        assert sum(plan["peak_parts"].values()) == pytest.approx(plan["peak_tensor_bytes"])
        peaks[bool(extra)] = plan["peak_bytes"]
    assert peaks[False] < 80 * GIB and peaks[True] > peaks[False] + 50 * GIB


def _between_saved_and_peak(overrides):
    """A budget above what the state and the saved activations need, below the planned peak."""
    from ablate import parallel
    from ablate.model.facts import measure
    from ablate.model.peak import plan_peak

    cfg = typed(overrides)
    facts = measure(cfg)
    saved = parallel.plan_bytes(facts.numels, cfg, split=facts.split).total + facts.activation_bytes
    peak = plan_peak(cfg, facts, gpu=False).tensors
    assert saved < peak
    return (saved + peak) / 2


def test_a_point_that_fits_by_its_saved_activations_but_not_its_peak_is_pruned(tmp_path):
    from ablate.maxbatch import Trials
    from ablate.tune import prune_reason

    # fsdp2 x 2 in bf16: 1.41 GB of state and saved activations, a planned peak of 1.76 GB (the root gathered
    # twice, autocast's weight copies: docs/layouts.md "The peak")
    workload = ["model=small", "train.seq_len=128", "parallel=fsdp2", "launcher.nproc_per_node=2", "precision=bf16"]
    budget = _between_saved_and_peak([*workload, "train.batch_size=4"])
    reason = prune_reason([*workload, "train.batch_size=4"], budget)
    assert reason and "planned peak" in reason and "over the" in reason
    trials = Trials(workload, tmp_path, budget, steps=2, cuda=False)
    assert trials(4) is False and trials.log[0]["why"].startswith("planned, not run: ")
    assert not (tmp_path / "max_batch_trials").exists()   # nothing was run
    # the whole search, as typed: every batch ruled out by the plan still leaves its record (~2 s)
    from ablate.maxbatch import main as maxbatch_main

    record = tmp_path / "search"
    maxbatch_main(["--mem-budget-gb", f"{budget / 1e9:.3f}", "--start", "4", "--multiple-of", "4", "--",
                   *workload, "logger=none", f"hydra.run.dir={record}"])
    summary = json.loads((record / "summary.json").read_text())
    assert summary["max_batch"] is None and summary["trials"][0]["why"].startswith("planned, not run: ")


def test_the_plan_says_whether_the_peak_fits_a_gpu(tmp_path, capsys):
    """In process (~2 s): `ablate.plan --hardware NAME|FILE` sets the planned peak beside one GPU's memory
    (conf/hardware: each file's keys, its datasheet FLOP/s the same the MFU reads); a name that is none is one line."""
    from ablate import hardware, plan
    from ablate.metrics import flops as F

    for hw in hardware.every():
        assert hw.memory_bytes > 0 and hw.peak_flops["bf16"] > 0 and hw.nvlink_bytes_per_s and hw.network_bytes_per_s
    assert hardware.for_device("NVIDIA H100 PCIe").name == "h100_pcie"
    assert hardware.for_device("NVIDIA H100 80GB HBM3").name == "h100_sxm"
    assert hardware.for_device("NVIDIA H100 NVL") is None
    assert F.datasheet_peak("NVIDIA H200", "bf16") == hardware.named("h200").peak_flops["bf16"]
    tiny_gpu = tmp_path / "tiny_gpu.yaml"
    tiny_gpu.write_text("name: tiny_gpu\ndevice_names: [TINY]\nmemory_gib: 0.001\npeak_tflops: {bf16: 1.0}\n")
    for given, fits in (("h100_sxm", True), (str(tiny_gpu), False)):
        plan.main(["--json", "--hardware", given, "model=tiny"])
        p = json.loads(capsys.readouterr().out)
        assert p["fits"] is fits and p["memory_left_bytes"] == pytest.approx(p["hardware"]["memory_bytes"]
                                                                              - p["peak_bytes"])
    code = plan.main(["--hardware", "nosuch", "model=tiny"])
    assert code == 2 and "valid: a100_80gb, b200, h100_96gb_500w, h100_pcie, h100_sxm, h200" in capsys.readouterr().err


@pytest.mark.parametrize("overrides", [
    ["model=small", "model.activation_checkpointing=selective", "precision=bf16"],
    ["model=small", "parallel=fsdp2", "launcher.nproc_per_node=2", "parallel.tp=2", "parallel.param_dtype=bf16"],
])
def test_the_built_in_llamas_activations_from_three_blocks_equal_all_of_them(overrides, monkeypatch):
    """model/facts.py measures the built-in Llama's saved tensors on three blocks and repeats the middle one; on
    fake tensors, through all 12 blocks, every figure comes out the same (in process, ~2 s each)."""
    from ablate.compose import validate
    from ablate.model import facts

    cfg = validate(compose_cfg(overrides))
    short = facts.measure_facts(cfg)
    monkeypatch.setattr(facts, "REPEATED_FROM", 10 ** 6)   # every block, as any other model is measured
    whole = facts.measure_facts(cfg)
    for key in ("numels", "vocab_size", "blocks", "activation_bytes", "split", "param_block"):
        assert getattr(short, key) == getattr(whole, key), key
    for key in ("bytes", "vocab_bytes", "by_block", "block_inputs", "kept_by_block", "copies_by_block",
                "copies_outside"):
        assert getattr(short.saved, key) == getattr(whole.saved, key), key
