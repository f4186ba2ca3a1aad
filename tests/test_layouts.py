"""The 64-GPU layouts on one device mesh (parallel/mesh.py, tp.py, comm_model.py; docs/layouts.md): the layout
decoded once and its refusals (in process, ~2 s), the plan's figures for 70b on fake tensors (~15 s), planned =
measured activations for model=small (one real 2-step run in this process, ~12 s), and real gloo runs of each
composition on 4 CPU ranks (the `trained` session runs: 3 of 4 ranks and 1 of 2, ~45 s on 2 cores)."""
from __future__ import annotations

import re

import pytest

from ablate import parallel
from ablate.compose import validate
from ablate.config import ConfigError
from ablate.model.facts import activation_bytes, saved_on_fake
from ablate.parallel.mesh import Layout
from ablate.plan import plan
from conftest import compose_cfg, main_in_process, read_jsonl, run_in_process


def layout(*overrides: str) -> Layout:
    return parallel.layout_of(validate(compose_cfg(list(overrides))))


@pytest.mark.parametrize("overrides, mesh", [
    (["parallel=fsdp2", "launcher.nproc_per_node=4"], (1, 1, 4, 1)),
    (["parallel=hsdp", "launcher.nproc_per_node=4", "parallel.shard_size=2"], (1, 2, 2, 1)),
    (["parallel=hsdp", "launcher.nproc_per_node=4"], (1, 1, 4, 1)),                 # default: one node's ranks
    (["parallel=hsdp", "launcher.nodes=2"], (1, 2, 1, 1)),                          # 2 nodes x 1 rank
    (["parallel=fsdp2", "launcher.nproc_per_node=4", "parallel.tp=2"], (1, 1, 2, 2)),
    (["parallel=hsdp", "launcher.nodes=2", "launcher.nproc_per_node=4", "parallel.tp=2"], (1, 2, 2, 2)),
    (["parallel=ddp", "launcher.nproc_per_node=4"], (1, 4, 1, 1)),
    (["parallel=none", "launcher.nproc_per_node=2", "parallel.tp=2"], (1, 1, 1, 2)),
    (["parallel=zero3", "launcher.nproc_per_node=2"], (1, 1, 2, 1)),
    (["parallel=none"], (1, 1, 1, 1)),
    (["parallel=none", "launcher.nproc_per_node=2", "parallel.pp=2"], (2, 1, 1, 1)),
    (["parallel=fsdp2", "launcher.nproc_per_node=4", "parallel.pp=2"], (2, 1, 2, 1)),
    (["parallel=hsdp", "launcher.nproc_per_node=8", "parallel.pp=2", "parallel.tp=2"], (2, 1, 2, 2)),
    (["parallel=none", "launcher.nproc_per_node=4", "parallel.pp=2", "parallel.tp=2"], (2, 1, 1, 2)),
])
def test_the_layout_is_decoded_once_from_the_parallel_and_launcher_nodes(overrides, mesh):
    got = layout(*overrides)
    assert got.shape == mesh and got.world == got.pp * got.dp * got.tp
    # a pipeline's stages and a tp group read one data-parallel rank's batches; stages are the outermost dim
    per_stage = got.dp * got.tp
    assert [got.dp_rank(r) for r in range(got.world)] == [r % per_stage // got.tp for r in range(got.world)]
    assert [got.pp_rank(r) for r in range(got.world)] == [r // per_stage for r in range(got.world)]


# (overrides, what the one line must say): each refused at compose time, before any rank starts
REFUSED = [
    (["parallel=fsdp2", "parallel.tp=3", "launcher.nproc_per_node=3"],
     "parallel.tp=3: does not divide model=tiny's attention heads"),
    (["parallel=hsdp", "parallel.shard_size=3", "launcher.nproc_per_node=4"],
     "parallel.shard_size=3: does not divide the 4 data-parallel rank(s)"),
    (["parallel=fsdp2", "parallel.tp=8", "launcher.nproc_per_node=4"], "parallel.tp=8: larger than the world of 4"),
    (["parallel=fsdp2", "parallel.tp=3", "launcher.nproc_per_node=4"], "parallel.tp=3: does not divide the world"),
    (["parallel=ddp", "parallel.tp=2", "launcher.nproc_per_node=2"],
     "parallel=ddp with parallel.tp=2: torch's DistributedDataParallel takes no DTensor"),
    (["parallel=zero3", "parallel.tp=2", "launcher.nproc_per_node=2"], "parallel=zero3 with parallel.tp=2: DeepSpeed"),
    (["parallel=none", "launcher.nproc_per_node=2"], "parallel=none with 2 ranks"),
    (["parallel=fsdp2", "parallel.shard_size=2", "launcher.nproc_per_node=2"], "shard_size=2: only parallel=hsdp"),
]


@pytest.mark.parametrize("overrides, message", REFUSED)
def test_a_layout_that_cannot_be_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        layout(*overrides)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("overrides, message", [
    (["parallel=fsdp2", "launcher.nproc_per_node=2", "parallel.param_dtype=bf16"],
     "parallel.param_dtype=bf16 with precision=fp32: the blocks would compute in bf16"),
    (["parallel=ddp", "launcher.nproc_per_node=2", "precision=bf16", "parallel.param_dtype=bf16"],
     "parallel.param_dtype / parallel.reduce_dtype with parallel=ddp: FSDP2's mixed precision"),
    (["parallel=fsdp2", "parallel.param_dtype=fp8"], "parallel.param_dtype=fp8: not a valid choice"),
])
def test_low_precision_all_gathers_are_fsdp2s_and_bf16s(monkeypatch, capsys, tmp_path, overrides, message):
    code = main_in_process(monkeypatch, [*overrides, f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_bad_layout_exits_2_in_one_line_with_no_run_dir(monkeypatch, capsys, tmp_path):
    run_dir = tmp_path / "run"
    code = main_in_process(monkeypatch, ["parallel=fsdp2", "parallel.tp=3", "launcher.nproc_per_node=3",
                                         f"hydra.run.dir={run_dir}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "parallel.tp=3" in err[0], err
    assert not run_dir.exists()


# --- the plan: 70b, bf16, batch 1, 64 GPUs (8 nodes x 8) ---------------------------------------------------------
SIXTY_FOUR = ["model=70b", "train.batch_size=1", "launcher=slurm", "launcher.nodes=8", "launcher.nproc_per_node=8",
              "parallel=fsdp2"]


@pytest.fixture(scope="module")
def seventy_b():
    """Fake-tensor forwards of 70b, one per (seq, precision), each ~3 s; tp and checkpointing are figures of
    the same measurement (facts.activation_bytes)."""
    out = {}
    for seq, prec in ((4096, "bf16"), (2048, "bf16"), (4096, "fp32")):
        cfg = validate(compose_cfg([*SIXTY_FOUR, f"precision={prec}", f"train.seq_len={seq}"]))
        out[seq, prec] = (cfg, saved_on_fake(cfg)[0])
    return out


@pytest.mark.slow
def test_the_70b_plan_tells_the_truth_about_activations(seventy_b):
    def gb(seq, prec, tp=1, ac=False):
        cfg, saved = seventy_b[seq, prec]
        cfg.model.activation_checkpointing = ac
        try:
            return activation_bytes(saved, cfg, tp)
        finally:
            cfg.model.activation_checkpointing = False

    s4k = gb(4096, "bf16")
    assert 1.8 <= s4k / gb(2048, "bf16") <= 2.2        # linear in the sequence: no seq^2 score matrix
    assert 40e9 <= s4k <= 250e9, s4k
    assert 0.4 <= s4k / gb(4096, "fp32") <= 0.7         # in the run's precision
    assert gb(4096, "bf16", tp=8) <= s4k / 2
    assert gb(4096, "bf16", ac=True) <= s4k / 4


@pytest.mark.slow
@pytest.mark.parametrize("layout_args, shard_group", [
    (["parallel=fsdp2"], 64), (["parallel=fsdp2", "parallel.tp=8"], 64),
    (["parallel=hsdp", "parallel.shard_size=2", "parallel.tp=8"], 16)])
def test_state_per_gpu_is_16_bytes_per_param_over_the_shard_group(monkeypatch, layout_args, shard_group):
    import ablate.plan as plan_module

    monkeypatch.setattr(plan_module, "measure", _numels_only)
    p = plan(validate(compose_cfg([*SIXTY_FOUR, "precision=bf16", *layout_args])))
    assert p["ablate"].total == pytest.approx(16 * p["params"] / shard_group, rel=0.05)


def _numels_only(cfg, tp=None):
    """The 70b's parameter sizes without a forward (the state plan needs no activations)."""
    from ablate.model import build
    from ablate.model.facts import ModelFacts

    lm = build(cfg.model, "meta")
    return ModelFacts([p.numel() for p in lm.parameters()], 128256, {}, 0.0, "not measured")


@pytest.mark.slow
def test_planned_activations_are_what_a_small_run_saves(tmp_path):
    args = ["model=small", "train.batch_size=4", "train.seq_len=128", "train.steps=2", "train.warmup_steps=1",
            "metrics.gemm_probe_n=128", "metrics.predict=false"]
    summary = run_in_process(tmp_path, args)
    planned = plan(validate(compose_cfg(args)))["activation_bytes"]
    assert summary["activation_bytes"] == pytest.approx(planned, rel=0.25), (summary["activation_bytes"], planned)


# --- real runs: 4 gloo CPU ranks --------------------------------------------------------------------------------
def losses(run):
    return [r["loss"] for r in run[1]]


@pytest.mark.slow
@pytest.mark.xdist_group("trained")   # shares the `trained` runs (fsdp2 on 2 ranks, the single-process reference)
def test_the_layout_never_changes_the_numbers(trained):
    hsdp = trained("hsdp", "fp32", 4, "parallel.shard_size=2")
    fsdp4 = trained("fsdp2", "fp32", 4)
    assert losses(hsdp) == pytest.approx(losses(fsdp4), rel=1e-4)
    fsdp_tp = trained("fsdp2", "fp32", 4, "parallel.tp=2")
    assert losses(fsdp_tp) == pytest.approx(losses(trained("fsdp2", "fp32", 2)), rel=2e-3)
    none_tp = trained("none", "fp32", 2, "parallel.tp=2", "train.grad_accum=2")
    assert losses(none_tp) == pytest.approx(losses(trained("none", "fp32", 1, "train.grad_accum=2")), rel=2e-3)

    for (summary, _), mesh, accum in ((hsdp, (2, 2, 1), 1), (fsdp4, (1, 4, 1), 1), (fsdp_tp, (1, 2, 2), 1),
                                      (none_tp, (1, 1, 2), 2)):
        layout = Layout(*mesh)
        assert summary["mesh"] == layout.record()
        assert summary["tokens_per_step"] == layout.dp * 8 * 64 * accum   # batch 8 x seq 64 per data-parallel rank
        by_dim = summary["comm_bytes_by_dim"]
        assert set(by_dim) == set(layout.active_dims()) and all(v > 0 for v in by_dim.values()), by_dim
        for key, modeled in summary["modeled"].items():   # the comm model (parallel/comm_model.py) within 1%
            if key.startswith("comm_bytes_by_dim.") and modeled is not None:
                assert by_dim[key.split(".", 1)[1]] == pytest.approx(modeled, rel=0.01), (key, by_dim, modeled)
        assert summary["activation_bytes"] > 0
    # a TP rank keeps half the model state of the fsdp2 rank beside it in the shard group; hsdp twice fsdp2's
    state = {k: max(sum(r["state_bytes"].values()) for r in run[0]["per_rank"])
             for k, run in (("hsdp", hsdp), ("fsdp4", fsdp4), ("fsdp_tp", fsdp_tp))}
    assert state["hsdp"] == pytest.approx(2 * state["fsdp4"], rel=0.05)
    assert state["fsdp_tp"] == pytest.approx(state["fsdp4"], rel=0.05)


def test_a_users_model_without_a_plan_and_model_hf_are_refused_tp(user_files):
    """A user's model without a tp_plan, and model=hf, are refused in one line (its plan's runs:
    tests/test_your_split.py)."""
    search = f"hydra.searchpath=[file://{user_files.config_dir}]"
    with pytest.raises(ConfigError, match=r"your model \(mymodels.MLPLM\) declares no tp_plan"):
        layout(search, "model=mine", "parallel=none", "parallel.tp=2", "launcher.nproc_per_node=2")
    with pytest.raises(ConfigError, match="model=hf has no tensor-parallel plan"):
        layout("model=hf", f"model.config={user_files.hf_config}", "parallel=fsdp2", "parallel.tp=2",
               "launcher.nproc_per_node=2")


@pytest.mark.slow
@pytest.mark.xdist_group("trained")   # shares the `trained` runs (fsdp2 x tp2 on 4 ranks, fsdp2 bf16 on 2)
def test_a_vocab_parallel_loss_and_bf16_all_gathers_change_the_bytes_not_the_numbers(trained):
    """parallel.loss_parallel (default with tp > 1): the loss per step equals the gathered logits' (fp32, 1e-4) and
    the tp dim stops moving the logits (b x s x vocab floats) for three values per token; parallel.param_dtype=bf16
    on fsdp2 x 2: the dp_shard bytes are 2/3 of the float32 all-gathers' (two bf16 all-gathers, one float32
    reduce-scatter), the loss within bf16's tolerance (2 more runs, ~20 s)."""
    split = trained("fsdp2", "fp32", 4, "parallel.tp=2")
    gathered = trained("fsdp2", "fp32", 4, "parallel.tp=2", "parallel.loss_parallel=false")
    assert losses(split) == pytest.approx(losses(gathered), rel=1e-4)
    tokens = 8 * 64   # batch x seq per data-parallel rank, one micro-step a step
    moved = gathered[0]["comm_bytes_by_dim"]["tp"] - split[0]["comm_bytes_by_dim"]["tp"]
    assert moved == pytest.approx(4 * tokens * (256 - 3), rel=0.01)   # model=tiny's vocabulary: 256
    for summary, _ in (split, gathered):
        assert summary["comm_bytes_by_dim"]["tp"] == pytest.approx(summary["modeled"]["comm_bytes_by_dim.tp"],
                                                                   rel=0.01)
    low = trained("fsdp2", "bf16", 2, "parallel.param_dtype=bf16")
    whole = trained("fsdp2", "bf16", 2)
    ratio = low[0]["comm_bytes_by_dim"]["dp_shard"] / whole[0]["comm_bytes_by_dim"]["dp_shard"]
    assert ratio == pytest.approx(2 / 3, rel=0.05), ratio
    assert low[0]["numerics"]["param_dtype"] == "bfloat16" and whole[0]["numerics"]["param_dtype"] == "float32"
    assert losses(low) == pytest.approx(losses(whole), rel=2e-2)
    assert low[0]["comm_bytes_by_dim"]["dp_shard"] == pytest.approx(low[0]["modeled"]["comm_bytes_by_dim.dp_shard"],
                                                                    rel=0.01)


@pytest.mark.slow
def test_selective_and_every_kth_block_checkpointing_sit_between_none_and_full(tmp_path):
    """model.activation_checkpointing: false | true | 2 (every second block) | selective (per op), on model=small
    (4 layers: every second block is two of them), four 3-step runs in this process (~10 s): the same loss per step
    (fp32, 1e-5); planned and measured activations, and the hardware FLOPs (recompute counted), between none's and
    full's."""
    args = ["model=small", "train.batch_size=2", "train.seq_len=32", "train.steps=3", "train.warmup_steps=1",
            "train.log_every=1", "metrics.gemm_probe_n=64", "metrics.predict=false"]
    runs, planned = {}, {}
    for mode in ("false", "true", "2", "selective"):
        overrides = [*args, f"model.activation_checkpointing={mode}"]
        summary = run_in_process(tmp_path / mode, overrides)
        runs[mode] = (summary, [r["loss"] for r in read_jsonl(tmp_path / mode / "metrics.jsonl")])
        planned[mode] = plan(validate(compose_cfg(overrides)))["activation_bytes"]
    for mode in ("true", "2", "selective"):
        assert runs[mode][1] == pytest.approx(runs["false"][1], rel=1e-5), mode
    for mode in ("2", "selective"):
        for figure in (lambda m: runs[m][0]["activation_bytes"], lambda m: planned[m]):
            assert figure("true") < figure(mode) < figure("false"), (mode, figure("true"), figure(mode))
    flops = {m: runs[m][0]["hw_flops_per_token"] for m in runs}
    assert flops["false"] < flops["selective"] < flops["true"] and flops["false"] < flops["2"] < flops["true"]
    assert planned["selective"] == pytest.approx(runs["selective"][0]["activation_bytes"], rel=0.10)
    with pytest.raises(ConfigError, match="model.activation_checkpointing=sometimes: not a valid choice"):
        validate(compose_cfg(["model.activation_checkpointing=sometimes"]))
