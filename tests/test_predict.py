"""The step-time model's arithmetic on fixed figures (src/ablate/predict), and `ablate.plan --hardware` printing it.
No timing here: the model's error against runs is a benchmark's to say. Cost: in process, ~17 s (the 8B plans, a
calibration)."""
from __future__ import annotations

import json
import re

import pytest

from ablate.predict import Machine, Step, crosses_nodes, predict, strides

MACHINE = Machine(rate={"bf16": 100e12}, peak={"bf16": 200e12}, intra_bytes_per_s=100e9, inter_bytes_per_s=10e9,
                  rate_source="fixed", name="test")
ONE = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1}


def step(**kwargs) -> Step:
    base = dict(hw_flops=100e12, model_flops=80e12, comm_bytes={}, tokens=1000.0, n_blocks=9, sizes=dict(ONE),
                nproc_per_node=8, strategy="none", column="bf16")
    return Step(**{**base, **kwargs})


def test_one_rank_is_its_flops_at_the_machines_rate():
    p = predict(step(), MACHINE)
    assert p["step_time_s"] == pytest.approx(1.0) and p["tokens_per_s"] == pytest.approx(1000.0)
    assert p["mfu"] == pytest.approx(80e12 / 1.0 / 200e12) and p["exposed_comm_s"] == {}


def test_fsdps_gathers_hide_behind_compute_but_one_units():
    sizes = {**ONE, "dp_shard": 8}
    short = predict(step(strategy="fsdp2", sizes=sizes, comm_bytes={"dp_shard": 40e9}), MACHINE)
    seconds = 40e9 * (7 / 8) / 100e9   # 0.35 s within the node, shorter than the 1 s of compute
    assert short["comm_s"]["dp_shard"] == pytest.approx(seconds)
    assert short["exposed_comm_s"]["dp_shard"] == pytest.approx(seconds / 10)   # 9 blocks + the root
    long = predict(step(strategy="fsdp2", sizes=sizes, comm_bytes={"dp_shard": 400e9}), MACHINE)
    assert long["exposed_comm_s"]["dp_shard"] == pytest.approx(3.5 - 1.0 + 0.35)


def test_ddps_all_reduce_overlaps_the_backward_and_tp_is_exposed():
    sizes = {**ONE, "dp_replicate": 2, "tp": 2}
    p = predict(step(strategy="ddp", sizes=sizes, nproc_per_node=2, comm_bytes={"dp_replicate": 20e9, "tp": 1e9}),
                MACHINE)
    # dp_replicate spans 4 ranks on nodes of 2: across nodes; all-reduce's bus factor 2(n-1)/n = 1
    assert p["comm_s"]["dp_replicate"] == pytest.approx(20e9 / 10e9)
    assert p["exposed_comm_s"]["dp_replicate"] == pytest.approx(2.0 - 2 / 3)
    assert p["exposed_comm_s"]["tp"] == pytest.approx(1e9 * 0.5 / 100e9)
    assert p["step_time_s"] == pytest.approx(1.0 + 2.0 - 2 / 3 + 0.005)


def test_the_last_bucket_of_each_reduction_is_exposed():
    """DDP's buckets all-reduce as the backward runs, but the last of each reduction is issued as its backward ends:
    one bucket a reduction (2 of 8 calls here) is exposed however long the compute; all of it where a reduction is
    one bucket."""
    sizes = {**ONE, "dp_replicate": 2}
    s = step(strategy="ddp", sizes=sizes, nproc_per_node=2, comm_bytes={"dp_replicate": 20e9},
             calls={"dp_replicate": 8}, reductions=2)
    seconds = 20e9 * 1.0 / 100e9   # within the node, bus factor 1: 0.2 s, shorter than the backward
    p = predict(s, MACHINE)
    assert p["comm_s"]["dp_replicate"] == pytest.approx(seconds)
    assert p["exposed_comm_s"]["dp_replicate"] == pytest.approx(seconds * 2 / 8)
    s.calls = {"dp_replicate": 2}
    assert predict(s, MACHINE)["exposed_comm_s"]["dp_replicate"] == pytest.approx(seconds)


def test_a_calls_latency_is_the_probes_after_as_much_compute_as_comes_before_it():
    """A calibrated file's base latency after 1 and 10 ms of work: the step's compute spread over its calls of the
    layout's dims (10 calls, 1 s of compute: 100 ms each, held at the last point); none: the file's base."""
    from dataclasses import replace

    machine = replace(MACHINE, latency={"base": 1e-3}, latency_after=((1e-3, 1e-3), (10e-3, 4e-3)))
    s = step(strategy="fsdp2", sizes={**ONE, "dp_shard": 2}, comm_bytes={"dp_shard": 0.0},
             calls={"dp_shard": 10, "tp": 1000})   # tp: not a dim of this layout, its calls not counted
    assert predict(s, machine)["comm_s"]["dp_shard"] == pytest.approx(10 * 4e-3)
    s.hw_flops = 100e12 * 0.055   # 55 ms of compute: 5.5 ms before each call, halfway
    assert predict(s, machine)["comm_s"]["dp_shard"] == pytest.approx(10 * 2.5e-3)
    assert predict(s, replace(machine, latency_after=()))["comm_s"]["dp_shard"] == pytest.approx(10 * 1e-3)


def test_ddp_calls_once_a_bucket_of_each_reduction_it_makes():
    """Syncing every micro-step all-reduces each micro-step's gradients (8 calls of the tiny model's one bucket),
    no_sync the last's (1)."""
    from ablate import parallel
    from ablate.compose import config_of
    from ablate.parallel.comm_model import expected_comm
    from ablate.predict import calls_of

    for name, calls in (("ddp_sync", 8), ("ddp", 1)):
        cfg = config_of(["model=tiny", f"parallel={name}", "launcher.nproc_per_node=2", "train.grad_accum=8"])[1]
        layout = parallel.layout_of(cfg)
        assert calls_of(cfg, layout, expected_comm(cfg, layout, 10**6), 2)["dp_replicate"] == calls


def test_zero_all_reduces_the_gradients_and_all_gathers_the_partitions():
    """ZeRO-1/2's dp_shard as DeepSpeed's stage_1_and_2.py moves it (counted on gloo, tiny, 2 ranks: 1,051,144 B a
    step in 5 calls, ZeRO-2 with grad_accum 2 1,576,712 in 6): each reduction all-reduces the gradient (ZeRO-2's
    every micro-step, ZeRO-1's once), the updated partitions are all-gathered once; each kind priced at its bus
    factor and hidden as DeepSpeed schedules it (the all-reduce's last bucket of each reduction exposed, the
    all-gather all of it). ZeRO-3: not modelled. In process, <1 s."""
    from ablate import parallel
    from ablate.compose import config_of
    from ablate.parallel.comm_model import expected_comm
    from ablate.predict import calls_of, zero_split

    n = 131392   # the tiny model's parameters
    for name, accum, per_param, calls in (("zero2", 1, 8, 5), ("zero2", 2, 12, 6), ("zero1", 2, 8, 5),
                                          ("zero3", 1, None, None)):
        cfg = config_of(["model=tiny", f"parallel={name}", "launcher.nproc_per_node=2", f"train.grad_accum={accum}"])[1]
        layout = parallel.layout_of(cfg)
        comm = expected_comm(cfg, layout, n)
        assert comm["dp_shard"] == (per_param * n if per_param else None), (name, accum)
        if per_param:
            assert calls_of(cfg, layout, comm, 2)["dp_shard"] == calls
            assert zero_split(cfg, comm)["dp_shard"]["all_gather"] == (pytest.approx(4 / per_param), 2)
    s = step(strategy="zero2", sizes={**ONE, "dp_shard": 2}, nproc_per_node=2, comm_bytes={"dp_shard": 30e9},
             calls={"dp_shard": 6}, reductions=2, traffic={"dp_shard": {"all_reduce": (2 / 3, 4),
                                                                         "all_gather": (1 / 3, 2)}})
    p = predict(s, MACHINE)   # 100 GB/s a kind within the node; 2 ranks: the all-reduce's bus factor 1, others 1/2
    assert p["comm_s"]["dp_shard"] == pytest.approx(20e9 / 100e9 + 10e9 / 2 / 100e9)
    assert p["exposed_comm_s"]["dp_shard"] == pytest.approx(0.2 * 2 / 4 + 0.05)   # 1 s of compute hides the rest


def test_calibrated_terms_price_ops_as_timed_and_each_pass_launches_again():
    """The per-op model's calibrated terms on fixed figures (no timing): an op timed at its own shapes costs that
    time (plus autograd's per op) where the rank runs it as recorded, its class's rate where not; every
    forward-backward of a step launches its ops again; the optimizer pays per tensor; a strategy's bookkeeping and
    what runs between the ops are per unit and pass; communication hides by the machine's measured overlap only."""
    from dataclasses import replace

    from ablate.predict.kernels import Work
    from ablate.predict.machine import strategy_key

    ops = ((("matmul", 1e12, 0.0, "mm(a)"), 2), (("memory", 0.0, 1e3, "add(b)"), 3))
    work = Work(((1.0, ops),), batch=4, param_tensors=10)
    machine = replace(MACHINE, attention={"bf16": 50e12}, memory_bytes_per_s=1e12, launch_s=1e-3,
                      op_seconds={"mm(a)": 0.5}, autograd_s=1e-4, optimizer_tensor_s=1e-2,
                      strategy_unit={strategy_key("fsdp2", {**ONE, "dp_shard": 2}): 0.1}, overlap=0.0,
                      framework_unit=0.01)
    as_recorded = step(work=work, passes=3, micro_sequences=4, share=1.0, param_tensors=10, strategy="fsdp2",
                       sizes={**ONE, "dp_shard": 2}, n_blocks=4, comm_bytes={"dp_shard": 1e9})
    p = predict(as_recorded, machine)
    parts = p["compute_s_by_class"]
    assert parts["matmul"] == pytest.approx(3 * 2 * (0.5 + 1e-4))         # timed, 3 passes
    assert parts["memory"] == pytest.approx(3 * 3 * (1e-3 + 1e-4))        # the launch floor, each pass
    assert parts["optimizer"] == pytest.approx(10 * 1e-2)
    timed_step = replace(machine, optimizer_seconds={"adamw|10|500": 0.25})   # this very step, timed at its shapes
    assert predict(replace(as_recorded, optimizer_signature="adamw|10|500"), timed_step)["compute_s_by_class"][
        "optimizer"] == pytest.approx(0.25)
    assert predict(replace(as_recorded, optimizer_signature="adamw|10|900"), timed_step)["compute_s_by_class"][
        "optimizer"] == pytest.approx(10 * 1e-2)                          # another layout's: per tensor
    assert parts["strategy"] == pytest.approx(0.1 * 3 * (4 + 1))
    assert parts["framework"] == pytest.approx(0.01 * 3 * (4 + 1))   # the Python between ops: per unit and pass
    assert p["exposed_comm_s"]["dp_shard"] == pytest.approx(p["comm_s"]["dp_shard"])   # overlap 0: all of it
    busy = predict(as_recorded, replace(machine, overlap=1.7))   # a noisy reading hides no more than a schedule
    assert busy["exposed_comm_s"]["dp_shard"] == pytest.approx(predict(as_recorded, replace(machine, overlap=1.0))[
        "exposed_comm_s"]["dp_shard"])
    halved = predict(replace(as_recorded, share=0.5), machine)["compute_s_by_class"]
    assert halved["matmul"] == pytest.approx(3 * 2 * (0.5e12 / 100e12 + 1e-4))   # not as recorded: its class


def test_which_dims_cross_nodes_follows_the_row_major_mesh():
    s = step(sizes={"pp": 2, "dp_replicate": 2, "dp_shard": 4, "tp": 2}, nproc_per_node=8)
    s.strides = strides(s.sizes)
    assert s.strides == {"tp": 1, "dp_shard": 2, "dp_replicate": 8, "pp": 16}
    assert [crosses_nodes(s, d) for d in ("tp", "dp_shard", "dp_replicate", "pp")] == [False, False, True, True]


def test_a_group_across_nodes_gets_one_nic_per_rank_a_node_and_hsdps_replicas_one():
    """nccl-tests' multi-node rings run rail to rail: 8 ranks a node of one FSDP group cross on 8 NICs; HSDP's
    replicate dim, one rank a node, on one; never more than the node's own bandwidth. An all-to-all: one NIC."""
    fsdp = step(strategy="fsdp2", sizes={**ONE, "dp_shard": 64}, comm_bytes={"dp_shard": 64e9})
    p = predict(fsdp, MACHINE)   # 8 x 10e9 = 80e9 < 100e9 within a node
    assert p["comm_s"]["dp_shard"] == pytest.approx(64e9 * (63 / 64) / 80e9)
    hsdp = step(strategy="hsdp", sizes={**ONE, "dp_replicate": 8, "dp_shard": 8},
                comm_bytes={"dp_replicate": 8e9, "dp_shard": 8e9})
    p = predict(hsdp, MACHINE)
    assert p["comm_s"]["dp_replicate"] == pytest.approx(8e9 * 2 * (7 / 8) / 10e9)   # one NIC
    assert p["comm_s"]["dp_shard"] == pytest.approx(8e9 * (7 / 8) / 100e9)          # within the node
    fast = Machine(rate={"bf16": 100e12}, peak={"bf16": 200e12}, intra_bytes_per_s=100e9, inter_bytes_per_s=50e9,
                   rate_source="fixed", name="fast nics")
    assert predict(fsdp, fast)["comm_s"]["dp_shard"] == pytest.approx(64e9 * (63 / 64) / 100e9)   # capped
    # an all-to-all over 2 nodes of 8: no ring to spread over the node's NICs, each rank's traffic on its own one
    experts = step(strategy="fsdp2", sizes={**ONE, "dp_shard": 16, "ep": 16}, comm_bytes={"ep": 16e9})
    assert predict(experts, MACHINE)["comm_s"]["ep"] == pytest.approx(16e9 * (15 / 16) / 10e9)


def test_a_pipelines_bubble_stretches_its_compute_and_unknowns_stay_unknown():
    p = predict(step(sizes={**ONE, "pp": 2}, bubble=0.2, comm_bytes={"pp": None}), MACHINE)
    assert p["step_time_s"] == pytest.approx(1.0 / 0.8) and p["bubble_s"] == pytest.approx(0.25)
    assert p["exposed_comm_s"] == {"pp": None}
    assert predict(step(column="fp8"), MACHINE)["step_time_s"] is None


def test_a_pipelines_bubble_stretches_the_collectives_of_its_actions_too():
    """A stage idles (p - 1) of its micro-batch actions, each its compute and its tp collectives; FSDP's gathers,
    hidden behind the whole step, are not in them."""
    sizes = {**ONE, "pp": 2, "tp": 2, "dp_shard": 2}
    p = predict(step(strategy="fsdp2", sizes=sizes, bubble=0.2, comm_bytes={"tp": 10e9, "dp_shard": 1e9}), MACHINE)
    tp, fsdp = 10e9 * 0.5 / 100e9, 1e9 * 0.5 / 100e9 / 10   # tp exposed whole; FSDP one unit's of 9 blocks + root
    assert p["exposed_comm_s"]["tp"] == pytest.approx(tp) and p["exposed_comm_s"]["dp_shard"] == pytest.approx(fsdp)
    assert p["step_time_s"] == pytest.approx((1.0 + tp) / 0.8 + fsdp)
    assert p["bubble_s"] == pytest.approx((1.0 + tp) * 0.25)


def test_the_plan_predicts_the_8b_step_per_op_on_1_and_8_nodes_of_h100s(capsys):
    """#68's done-whens, in process (~6 s: the 8B's ops recorded once on fake tensors): MFU between 0.25 and 0.55
    from the file's achieved rates, not the datasheet's; 64 GPUs within 15% of 8 per GPU (torchtitan published 5,605
    at 128 against 5,762 at 8); a file without achieved figures stays a bound, and says so."""
    from ablate import plan

    def predicted(hardware, nodes):
        plan.main(["--json", "--hardware", hardware, "model=8b", "parallel=fsdp2", "launcher=slurm",
                   f"launcher.nodes={nodes}", "launcher.nproc_per_node=8", "precision=bf16", "train.batch_size=2",
                   "train.seq_len=8192", "model.max_seq_len=8192", "model.activation_checkpointing=selective"])
        return json.loads(capsys.readouterr().out)["predicted"]

    one, eight = predicted("h100_sxm", 1), predicted("h100_sxm", 8)
    assert 0.25 <= one["mfu"] <= 0.55 and one["rate_source"].startswith("achieved rates per op class")
    assert set(one["compute_s_by_class"]) == {"matmul", "attention", "memory", "optimizer"}
    assert one["compute_s"] == pytest.approx(sum(one["compute_s_by_class"].values()))
    assert eight["tokens_per_s"] / 64 == pytest.approx(one["tokens_per_s"] / 8, rel=0.15)
    bound = predicted("h100_pcie", 1)
    assert "datasheet peak" in bound["rate_source"] and bound["compute_s_by_class"] is None


def test_a_gpu_run_predicts_its_step_from_its_calibrated_rate_and_a_cpu_run_from_its_free_step():
    """summary.json's `predicted` (predict.for_run), on a stand-in for a run's throughput collector: an H100 with
    its measured GEMM rate; a CPU: the prediction it made before its first step (predict/here.py) with its MFU
    against the run's calibrated peak, or None and why not in notes."""
    from types import SimpleNamespace

    from ablate import parallel
    from ablate.compose import validate
    from ablate.metrics.flops import FlopModel
    from ablate.predict import for_run
    from conftest import compose_cfg

    cfg = validate(compose_cfg(["model=small", "precision=bf16", "parallel=fsdp2", "launcher.nproc_per_node=8"]))
    layout = parallel.layout_of(cfg)
    facts = {"modeled": {"state_bytes_total": 1.0, "comm_bytes_by_dim.dp_shard": 3e9}, "blocks": {"count": 12},
             "params": 150_000_000}
    gpu = SimpleNamespace(peak=SimpleNamespace(device_name="NVIDIA H100 80GB HBM3", measured=600e12),
                          flop_model=FlopModel.analytic(cfg.model))
    p = for_run(cfg, layout, facts, gpu, notes := {})
    assert p["step_time_s"] > 0 and 0 < p["mfu"] < 1 and not notes
    assert "this GPU's calibrated GEMM rate" in p["rate_source"] and set(p["exposed_comm_s"]) == {"dp_shard"}
    tokens = 8 * 8 * cfg.train.seq_len                         # 8 data-parallel ranks x batch 8 x seq
    assert p["tokens_per_s"] == pytest.approx(tokens / p["step_time_s"])
    cpu = SimpleNamespace(peak=SimpleNamespace(device_name="cpu", measured=1e11), flop_model=gpu.flop_model)
    made = {"step_time_s": 0.5, "tokens_per_s": tokens / 0.5, "mfu": None, "exposed_comm_s": {"dp_shard": 0.1}}
    p = for_run(cfg, layout, facts, cpu, notes, made)
    assert p["step_time_s"] == 0.5 and p["mfu"] == pytest.approx(FlopModel.analytic(cfg.model).training(
        8 * cfg.train.seq_len, 8 * cfg.train.seq_len ** 2).model / 0.5 / 1e11) and not notes
    why = "not predicted: metrics.predict=false (...)"
    assert for_run(cfg, layout, facts, cpu, notes, {"step_time_s": None, "why": why}) is None
    assert notes["predicted"] == why
    off = validate(compose_cfg(["model=small", "precision=bf16", "parallel=fsdp2", "launcher.nproc_per_node=8",
                                "metrics.predict=false"]))
    assert for_run(off, layout, facts, gpu, notes := {}) is None and "metrics.predict=false" in notes["predicted"]


@pytest.mark.slow
def test_the_advisor_ranks_what_fits_and_its_sweep_runs(tmp_path, capsys):
    """`ablate.plan --rank --hardware h100_sxm ... --write-sweep DIR/sweeps/adv.yaml --arms 2`, in process (~10 s:
    336 layouts, the command composed once), then the written sweep run by `ablate.sweeps --config-dir DIR adv` (2
    runs of 4 ranks, 4 steps: +25 s). Every layout trains the command's global batch; the sweep's arms are two
    distinct meshes."""
    from ablate import plan
    from ablate.sweeps.__main__ import main as sweeps_main
    from conftest import drive_in_process

    sweep = tmp_path / "conf" / "sweeps" / "adv.yaml"
    plan.main(["--rank", "--json", "--hardware", "h100_sxm", "model=tiny", "launcher.nproc_per_node=4",
               "precision=bf16", "--write-sweep", str(sweep), "--arms", "2"])
    out = json.loads(capsys.readouterr().out)
    ranked = out["ranked"]
    whole = [r["tokens_per_s"] for r in ranked if not r["not_modelled"]]   # first, best first; then the bounds
    assert whole and whole == sorted(whole, reverse=True) and ranked[:len(whole)] == [r for r in ranked
                                                                                    if not r["not_modelled"]]
    assert all(r["peak_bytes"] <= 80 * 2**30 for r in ranked) and out["left_out"]   # tp 4 and 8: tiny's kv heads
    assert {r["global_batch"] for r in ranked} == {32} and all(0 < r["headroom"] < 1 for r in ranked)
    assert any(r["mesh"]["pp"] > 1 for r in ranked) and all(r["bound"].split()[-1].endswith("%") for r in ranked)
    import yaml

    arms = yaml.safe_load(sweep.read_text())["sweep"]["arm_values"]
    assert len({(a["name"], a["tp"], a["pp"]) for a in arms.values()}) == 2   # two layouts, not two of one
    assert drive_in_process(sweeps_main, ["--config-dir", str(tmp_path / "conf"), "adv", "--dir", str(tmp_path / "d"),
                                          "--", "logger=none", "train.steps=4", "train.warmup_steps=1"]) == 0
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "d").glob("adv/*/summary.json")]
    assert len(summaries) == 2 and all(name in (tmp_path / "d" / "report.md").read_text() for name in arms)
    # each run's own prediction, beside its measured step in the report; a pipeline's says why it has none here
    for s in summaries:
        assert s["predicted"] or "pipelines" in s["notes"]["predicted"], s["notes"].get("predicted")
    predicted = [s for s in summaries if s["predicted"]]
    shown = (tmp_path / "d" / "report.md").read_text().split("| arm | predicted step |")
    assert len(shown) == (2 if predicted else 1)


def test_a_rank_s_ops_are_recorded_once_per_class_and_a_block_repeats():
    """predict/kernels.py on the tiny model (~2 s): its 1- and 2-block records, extrapolated to 4 blocks, cost what
    the 4-block model's own record costs, op for op; a matmul's FLOPs are 2 M K N; causal SDPA counts half its
    forward's 4 b h s s' d, its backward 2.5x that."""
    import torch

    from ablate.compose import validate
    from ablate.predict import kernels
    from conftest import compose_cfg

    cfg = validate(compose_cfg(["model=tiny", "model.n_layers=4", "precision=bf16",
                                "model.activation_checkpointing=selective"]))
    whole = kernels.Work(((1.0, tuple(kernels.recorded(cfg, cfg.model).ops.items())),))
    def priced(kind, flops, moved, signature):
        return {"matmul": 1.0, "attention": 3.0, "memory": 0.0}[kind] * flops + moved * 1e-3 + 7.0
    assert kernels.work_of(cfg).cost(priced, 2, 3, 0.5) == pytest.approx(whole.cost(priced, 2, 3, 0.5))
    assert kernels.work_of(cfg, pp=2).cost(priced, 1, 1, 1) < whole.cost(priced, 1, 1, 1)
    with kernels.OpRecorder() as rec:
        torch.randn(8, 16) @ torch.randn(16, 4)
        q = torch.randn(1, 2, 32, 8)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    kinds = {op[0]: op for op in rec.ops}
    assert kinds["matmul"][3] == "aten.mm.default(float32[8, 16], float32[16, 4])" and kinds["matmul"][3] in rec.specs
    assert kinds["matmul"][1] == 2 * 8 * 16 * 4
    assert kinds["attention"][1] == 4 * 1 * 2 * 32 * 32 * 8 * 0.5


def test_calibrate_writes_a_hardware_file_the_plan_predicts_with(tmp_path, capsys):
    """`python -m ablate.calibrate --out F` in process on the tiny model, one rank (~9 s: matmul, SDPA, a large add,
    a launch, autograd's chain, the optimizer, each timed for 0.3 s; the model's ops replayed for 1 s): a file of
    conf/hardware's keys with each figure's provenance, which `ablate.plan --hardware F` predicts with op by op; a
    figure of the wrong kind is one line naming its key."""
    import torch

    from ablate import hardware, plan
    from ablate.calibrate import main as calibrate
    from ablate.calibrate import planned
    from ablate.compose import config_of
    from ablate.config import ConfigError

    threads = torch.get_num_threads()
    try:
        assert calibrate(["--out", str(tmp_path / "here.yaml"), "model=tiny"]) == 0
    finally:
        torch.set_num_threads(threads)
    hw = hardware.named(str(tmp_path / "here.yaml"))
    assert hw.matmul_flops["fp32"] > 0 and hw.attention_flops["fp32"] > 0 and hw.memory_bytes_per_s > 0
    assert "measured here" in hw.provenance["matmul_tflops"] and hw.launch_s > 0
    assert hw.op_seconds and all(t > 0 for t in hw.op_seconds.values()) and hw.optimizer_tensor_s > 0
    assert hw.autograd_s is not None and "replayed" in hw.provenance["op_us"]
    assert list(hw.optimizer_seconds) == [planned(config_of(["model=tiny"])[1])[0].optimizer_signature]
    capsys.readouterr()
    plan.main(["--json", "--hardware", str(tmp_path / "here.yaml"), "model=tiny"])
    p = json.loads(capsys.readouterr().out)["predicted"]
    assert p["step_time_s"] > 0 and set(p["compute_s_by_class"]) == {"matmul", "attention", "memory", "optimizer",
                                                                       "framework"}
    assert "less what this file's per-op figures price it at" in hw.provenance["framework_unit_us"]
    assert p["compute_s_by_class"]["optimizer"] == pytest.approx(next(iter(hw.optimizer_seconds.values())))
    bad = tmp_path / "bad.yaml"
    bad.write_text(re.sub(r"launch_us: .*", "launch_us: fast", (tmp_path / "here.yaml").read_text()))
    with pytest.raises(ConfigError, match="launch_us must be a number"):
        hardware.named(str(bad))


def test_calibrate_replays_an_op_at_its_strides_and_shrinks_a_layout_to_its_structure():
    """In process, no timing (~1 s: two compositions): a recorded argument is rebuilt at its shape, strides and
    dtype (an expanded one too); the strategy's bookkeeping is measured on the run's own layout with the model's
    blocks and heads kept and every matrix a few elements."""
    import torch

    from ablate.calibrate.ops import materialized
    from ablate.calibrate.strategy import shrunk
    from ablate.compose import config_of
    from ablate.predict.kernels import TensorSpec

    expanded = materialized(TensorSpec((4, 3), (0, 1), torch.bfloat16), torch.device("cpu"))
    assert expanded.shape == (4, 3) and expanded.stride() == (0, 1) and expanded.dtype == torch.bfloat16
    assert str(TensorSpec((4, 3), (0, 1), torch.bfloat16)) == "bfloat16[4, 3]s[0, 1]"
    argv = ["model=small", "parallel=fsdp2", "parallel.tp=2", "launcher.nproc_per_node=4", "train.grad_accum=4"]
    small = config_of([*argv, *shrunk(config_of(argv)[1])])[1]
    assert (small.model.n_layers, small.model.n_heads, small.parallel.tp) == (12, 12, 2)
    assert small.model.dim == 24 and small.train.seq_len == 8 and small.train.batch_size == 1
    assert small.train.grad_accum == 4   # as many micro-steps as the run: DDP's reductions as often
