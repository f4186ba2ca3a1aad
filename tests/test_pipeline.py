"""The fourth mesh dim: pipeline stages (parallel.pp), their schedules, the measured bubble, and what is refused.

Cost: the refusals are in process (about a second); the real runs on 2 and 4 gloo ranks, forked by the launcher
in this process, about 30 s in all (marked slow)."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from ablate.config import ConfigError
from ablate.model.contract import Blocks, LanguageModel
from ablate.model.stages import outline
from conftest import drive_in_process, launch_in_process, main_in_process, read_jsonl

TINY4 = ["model=tiny", "model.n_layers=4", "train.steps=6", "train.warmup_steps=1", "train.log_every=1"]


def run(run_dir, overrides) -> int:
    """`python -m ablate OVERRIDES` as typed (its ranks forked by the launcher in this process): its exit code."""
    return launch_in_process(["logger=none", *overrides, f"hydra.run.dir={run_dir}"])


def losses(run_dir) -> list:
    return [row["loss"] for row in read_jsonl(run_dir / "metrics.jsonl")]


@pytest.mark.parametrize("overrides, message", [
    (["parallel.pp=3", "launcher.nproc_per_node=4"], "parallel.pp=3: does not divide the world of 4 rank(s)"),
    (["parallel=ddp", "parallel.pp=2", "launcher.nproc_per_node=4"], "parallel=ddp with parallel.pp=2"),
    (["parallel=zero2", "parallel.pp=2", "launcher.nproc_per_node=2"], "parallel=zero2 with parallel.pp=2"),
    (["parallel.pp=2", "launcher.nproc_per_node=2", "parallel.pp_schedule=interleaved_1f1b"],
     "interleaving needs several stages per rank"),
    (["parallel.pp=2", "launcher.nproc_per_node=2", "parallel.pp_stages_per_rank=2"],
     "parallel.pp_stages_per_rank=2 with parallel.pp_schedule=1f1b: one stage per rank"),
    (["parallel.pp=2", "launcher.nproc_per_node=2", "parallel.pp_microbatches=1"],
     "1F1B needs at least as many micro-batches as stages"),
    (["parallel.pp=2", "launcher.nproc_per_node=2", "parallel.pp_microbatches=3"],
     "train.batch_size=8: not divisible into parallel.pp_microbatches=3"),
    (["parallel.pp=2", "launcher.nproc_per_node=2", "parallel.pp_schedule=interleaved_1f1b",
      "parallel.pp_stages_per_rank=2", "parallel.pp_microbatches=5", "train.batch_size=5", "model.n_layers=4"],
     "interleaved_1f1b runs them in 2 rounds"),
    (["parallel.pp=2", "launcher.nproc_per_node=2", "model.n_layers=3"], "3 layers do not divide into 2 stages"),
    (["parallel.pp=2", "launcher.nproc_per_node=2", "model.tie_embeddings=true"], "tied embeddings"),
    (["parallel.pp=2", "launcher.nproc_per_node=2", "train.grad_accum=2"], "give parallel.pp_microbatches instead"),
    (["parallel.pp=2", "launcher.nproc_per_node=2", "train.seq_len_min=16"], "train.seq_len_min=16 with"),
    (["parallel=fsdp2", "parallel.pp=2", "launcher.nproc_per_node=4", "parallel.pp_schedule=zero_bubble",
      "parallel.pp_stages_per_rank=2", "model.n_layers=4"], "zero_bubble with parallel=fsdp2"),
    (["parallel.pp_microbatches=4"], "parallel.pp_microbatches=4: a pipeline's setting, with parallel.pp=1"),
    (["parallel.pp=2", "parallel.pp_schedule=looped"], "parallel.pp_schedule=looped: not a valid choice"),
])
def test_a_pipeline_that_cannot_run_is_refused_in_one_line(monkeypatch, capsys, tmp_path, overrides, message):
    code = main_in_process(monkeypatch, ["model=tiny", *overrides, f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


class Sideways(nn.Module):
    """A forward that is not a sequence of its blocks: each block reads the embedding, not the previous block."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.head = nn.Linear(8, 16)

    def forward(self, tokens):
        h = self.embed(tokens)
        return self.head(sum(block(h) for block in self.blocks))


def test_a_model_whose_forward_is_not_its_blocks_in_turn_is_refused():
    net = Sideways()
    with pytest.raises(ConfigError, match="a block's input is not the previous block's output"):
        outline(LanguageModel(net, Blocks("blocks", list(net.blocks), "rule")), "sideways")
    with pytest.raises(ConfigError, match="it has no list of blocks"):
        outline(LanguageModel(net, Blocks(None, [], "none")), "sideways")


@pytest.mark.slow
def test_every_schedule_trains_the_unsplit_models_loss(tmp_path):
    """pp2 on 2 ranks under each schedule (v = 2 for the interleaved ones) against one rank: fp32, relative 1e-4;
    pp2 x tp2 on 4 ranks too (2e-3, tensor parallelism's reductions in another order)."""
    assert run(tmp_path / "one", TINY4) == 0
    one = losses(tmp_path / "one")
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zero_bubble", 2)):
        run_dir = tmp_path / name
        run(run_dir, [*TINY4, "parallel.pp=2", "launcher.nproc_per_node=2", f"parallel.pp_schedule={name}",
                                 f"parallel.pp_stages_per_rank={v}", "parallel.pp_microbatches=4"])
        assert losses(run_dir) == pytest.approx(one, rel=1e-4), name
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["mesh"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 1}
        assert summary["comm_bytes_by_dim"]["pp"] > 0 and summary["tokens_per_step"] == 8 * 64
        assert summary["pipeline"]["schedule"] == name and 0 <= summary["pp_bubble"] < 1
        if v == 1:   # the peak measured against the most loaded stage's, planned (1.06 here)
            assert 0.8 < summary["peak_ratio"] < 1.25, summary["peak_ratio"]
        else:        # two stages a rank: torch's MemTracker cannot follow them; said
            assert "memory tracker cannot follow" in summary["notes"]["peak_bytes_measured"]
    assert run(tmp_path / "tp", [*TINY4, "parallel.pp=2", "parallel.tp=2", "launcher.nproc_per_node=4"]) == 0
    assert losses(tmp_path / "tp") == pytest.approx(one, rel=2e-3)


@pytest.mark.slow
def test_a_pipeline_under_fsdp2_resumes_to_the_uninterrupted_loss(tmp_path, capsys):
    """pp2 x fsdp2 on 4 ranks: the loss of fsdp2 on 2 ranks; a checkpoint at step 3, resumed to 6, equals 6 steps
    straight; another pp refused."""
    layout = [*TINY4, "parallel=fsdp2", "parallel.pp=2", "launcher.nproc_per_node=4", "parallel.pp_microbatches=4"]
    assert run(tmp_path / "whole", layout) == 0
    assert run(tmp_path / "fsdp2", [*TINY4, "parallel=fsdp2", "launcher.nproc_per_node=2"]) == 0
    assert losses(tmp_path / "whole") == pytest.approx(losses(tmp_path / "fsdp2"), rel=1e-4)
    assert run(tmp_path / "cut", [*layout, "train.steps=3", "train.checkpoint_every=3"]) == 0
    assert run(tmp_path / "cut", [*layout, f"train.resume={tmp_path / 'cut'}"]) == 0
    assert losses(tmp_path / "cut") == pytest.approx(losses(tmp_path / "whole"), rel=1e-5)
    code = run(tmp_path / "other", [*TINY4, "parallel=fsdp2", "launcher.nproc_per_node=2",
                                    f"train.resume={tmp_path / 'cut'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "parallel.pp=2 -> 1" in err[-1], err[-3:]


@pytest.mark.slow
@pytest.mark.serial   # a timing: alone, after the parallel part
def test_gpipes_measured_bubble_is_near_its_expected_one(tmp_path):
    """GPipe, pp 2, m = 4: (p - 1) / (m + p - 1) = 0.2 expected; measured within 0.1 on a model whose blocks
    dominate a step (dim 384, 128 tokens)."""
    assert run(tmp_path, ["model=tiny", "model.dim=384", "model.n_layers=4", "model.ffn_hidden=1152",
                          "train.seq_len=128", "train.steps=10", "train.warmup_steps=2", "parallel.pp=2",
                          "launcher.nproc_per_node=2", "parallel.pp_schedule=gpipe",
                          "parallel.pp_microbatches=4"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pp_bubble_expected"] == pytest.approx(0.2)
    assert abs(summary["pp_bubble"] - 0.2) < 0.1, [r["pp_bubble"] for r in summary["per_rank"]]
    assert torch.tensor([r["pp_bubble"] for r in summary["per_rank"]]).min() > 0


def test_the_readmes_model_is_refused_for_its_residual_outside_the_blocks(monkeypatch, capsys, tmp_path, user_files):
    """MLPLM adds each block's residual in its own forward (`h = h + block(h)`): no stage could take it on."""
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    code = main_in_process(monkeypatch, ["--config-dir", str(user_files.config_dir), "model=mine", "parallel.pp=2",
                                         "launcher.nproc_per_node=2", f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "a residual added outside the blocks" in err[0], err
    assert not (tmp_path / "run").exists()


def test_your_models_blocks_not_dividing_into_the_stages_is_refused_before_any_rank(monkeypatch, capsys, tmp_path,
                                                                                      user_files):
    """A 4-block nanoGPT-style model at pp 3: the pipeline's own rule, counted on the meta device (in process)."""
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    code = main_in_process(monkeypatch, ["--config-dir", str(user_files.config_dir), "model=gpt_tp",
                                         "model.n_layer=4", "parallel.pp=3", "launcher.nproc_per_node=3",
                                         "train.batch_size=6", f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "model=gpt_tp's 4 blocks do not divide into them" in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_your_models_are_cut_by_their_blocks(tmp_path, user_files, monkeypatch):
    """A nanoGPT-style model (blocks named `h`, learned positions read as a weight) and a transformers Llama: pp2
    trains the one rank's loss (fp32, 6 steps; +15 s)."""
    monkeypatch.setenv("PYTHONPATH", user_files.env["PYTHONPATH"])
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    for name, model in (("gpt", ["--config-dir", str(user_files.config_dir), "model=gpt_tp"]),
                        ("hf", ["model=hf", f"model.config={user_files.hf_config}"])):
        common = [*model, "train.steps=6", "train.warmup_steps=1", "train.log_every=1"]
        assert run(tmp_path / f"{name}_one", common) == 0
        assert run(tmp_path / f"{name}_pp", [*common, "parallel.pp=2", "launcher.nproc_per_node=2"]) == 0
        assert losses(tmp_path / f"{name}_pp") == pytest.approx(losses(tmp_path / f"{name}_one"), rel=1e-4), name


@pytest.mark.slow
def test_the_pipeline_sweep_reports_every_schedules_arm(tmp_path):
    """`python -m ablate.sweeps pipeline` (docs/layouts.md), 4 steps a run: each schedule's arm against 1F1B, its
    bubble beside the expected one, the layout column with pp first (+50 s: 5 runs of 4 ranks)."""
    from ablate.sweeps.__main__ import main as sweeps_main

    code = drive_in_process(sweeps_main, ["pipeline", "--dir", str(tmp_path), "--", "logger=none", "train.steps=4",
                                          "train.warmup_steps=1"])
    report = (tmp_path / "report.md").read_text()
    assert code == 0
    for arm in ("gpipe_m4", "interleaved_m4", "zero_bubble_m4", "1f1b_m8"):
        assert f"`{arm}` vs `1f1b_m4`" in report, report
    assert "pp_bubble_expected" in report and "4x1x1x1" in report, report
