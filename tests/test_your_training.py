"""Your training, ablated: a user's own model (tests/user/mymodels.py, `_target_` in tests/user/conf/model/),
a transformers model from its config, a token file, an optimizer and schedule, a config dir and a sweep of
one's own. The contract, FLOPs, schedule and data are checked in process with hand-checked numbers; each way
in runs end to end once (costs noted per test)."""
import csv
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest
import torch

from ablate import data as data_group
from ablate import optim
from ablate.compose import config_of
from ablate.config import ConfigError, DataConfig, HFModelConfig, ModelConfig, OptimConfig, UserModelConfig
from ablate.metrics import flops as F
from ablate.model import build, find_blocks
from ablate.model.facts import flop_model, measure
from ablate.parallel.ddp import buffer_sync
from conftest import USER_DIR, launch_in_process, main_in_process, read_jsonl, run_cli, run_module
from planted import planted

sys.path.insert(0, str(USER_DIR))   # the user's module, importable as it is from their working directory
MINE = UserModelConfig(target="mymodels.MLPLM", name="mine", args={"vocab_size": 512, "dim": 64, "n_layers": 2})
# MLPLM(512, 64, 2) by hand: per block up 64x256 + down 256x64 = 32,768 matmul weights, x 2 blocks, + the head
# 64 x 512 = 32,768: N = 98,304; no attention, so training FLOPs per token = 6N = 589,824
MINE_MATMUL = 2 * (64 * 256 + 256 * 64) + 64 * 512


def has_mfu(summary) -> bool:
    """An MFU was computed: a figure, or one marked invalid with its value (a peak cached while the host was
    busy can be below what a later quiet run achieves: the run says so rather than quote over 100%)."""
    return summary["mfu"] is not None or (summary.get("invalid") or {}).get("mfu", {}).get("value") is not None


def user_cfg(tmp_files, *overrides):
    return config_of(["--config-dir", str(tmp_files.config_dir), *overrides])[1]


# -- the contract (in process, < 1 s each) ----------------------------------------------------------------

def test_blocks_are_found_by_rule_or_by_name(user_files):
    found = build(MINE, "meta").blocks.record()
    assert found == {"path": "blocks", "count": 2, "class": "Sequential", "found_by": "rule"}
    assert build(ModelConfig(), "meta").blocks.record()["path"] == "layers"
    hf = build(HFModelConfig(config=str(user_files.hf_config)), "meta")
    assert hf.blocks.record() == {"path": "model.layers", "count": 2, "class": "LlamaDecoderLayer", "found_by": "rule"}
    named = find_blocks(build(MINE, "meta").net, "blocks.0")
    assert named.found_by == "named" and len(named.modules) == 1
    with pytest.raises(ConfigError, match="model.blocks=nope: the model has no such submodule"):
        find_blocks(build(MINE, "meta").net, "nope")


def test_a_model_that_breaks_the_contract_is_refused_saying_what_came_back(user_files):
    cfg = user_cfg(user_files, "model=mine", "model._target_=mymodels.PerSequenceScore", "~model.dim",
                   "~model.n_layers")
    with pytest.raises(ConfigError, match=r"returned a tensor of shape \[1, 1\] for token ids of shape \[1, 64\]"):
        measure(cfg)


def test_user_model_flops_are_6n_of_its_matmuls_and_hf_llama_matches_the_formula(user_files):
    mine = flop_model(MINE, 64, build(MINE, "meta").net)
    assert mine.matmul_params == MINE_MATMUL == 98_304
    assert mine.training(1, 64).model == pytest.approx(6 * MINE_MATMUL, rel=0.02)   # exactly 589,824 here
    assert mine.source == F.COUNTED
    # transformers' Llama with the tiny shapes, counted, against ablate's own formula for the same shapes
    hf_cfg = HFModelConfig(config=str(user_files.hf_config))
    counted = flop_model(hf_cfg, 64, build(hf_cfg, "meta").net).training(64, 64 * 64).model
    analytic = F.training_flops(ModelConfig(), 64, 64 * 64).model
    assert counted == pytest.approx(analytic, rel=0.01)


def test_a_user_models_flops_are_counted_once_per_length_unless_it_recomputes(monkeypatch):
    """Each count is a forward and backward on the meta device (~0.9 s for an 8B model): without activation
    checkpointing the recomputing variant is the same count, not counted again (~0.2 s)."""
    from dataclasses import replace

    from ablate.model import facts

    counted = []
    count = facts.counted_flops
    monkeypatch.setattr(facts, "counted_flops", lambda cfg, n, ckpt: counted.append((n, ckpt)) or count(cfg, n, ckpt))
    plain = flop_model(MINE, 64, build(MINE, "meta").net)
    assert sorted(counted) == [(32, False), (64, False)]
    counted.clear()
    recomputing = flop_model(replace(MINE, activation_checkpointing=True), 64, build(MINE, "meta").net)
    assert sorted(counted) == [(32, False), (32, True), (64, False), (64, True)]
    assert plain.training(1, 64).model == recomputing.training(1, 64).model


def test_activations_are_measured_and_grow_with_the_batch():
    small, big = (measure(user_cfg_default(b)) for b in (2, 4))
    assert big.activation_bytes == 2 * small.activation_bytes > 0
    ckpt = measure(user_cfg_default(4, "model.activation_checkpointing=true"))
    assert ckpt.activation_bytes < big.activation_bytes   # checkpointing keeps each block's input only


def user_cfg_default(batch, *extra):
    return config_of([f"train.batch_size={batch}", *extra])[1]


def test_ddp_broadcasts_real_buffers_only():
    from mymodels import BatchNormLM

    assert buffer_sync(BatchNormLM()) == {}                     # running statistics: rank 0's, as torch's default
    assert list(buffer_sync(build(ModelConfig()).net).values()) == [False]   # RoPE tables: constants


# -- optimizer and schedule (in process) -------------------------------------------------------------------

def test_schedules_by_hand():
    cos = OptimConfig(lr=1.0, schedule="warmup_cosine", warmup_steps=4, min_lr_ratio=0.1)
    assert [optim.lr_at(s, cos, 12) for s in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert optim.lr_at(8, cos, 12) == pytest.approx(0.1 + 0.9 * 0.5)   # half way: cos(pi/2) = 0
    assert optim.lr_at(12, cos, 12) == pytest.approx(0.1)               # the floor at the last step
    lin = OptimConfig(lr=1.0, schedule="warmup_linear", warmup_steps=0, min_lr_ratio=0.0)
    assert [optim.lr_at(s, lin, 4) for s in (1, 2, 4)] == [0.75, 0.5, 0.0]
    assert optim.lr_at(3, OptimConfig(lr=0.5), 10) == 0.5
    kept = OptimConfig(lr=1.0, schedule="warmup_cosine", warmup_steps=4, min_lr_ratio=0.1, decay_steps=12)
    assert [optim.lr_at(s, kept, 20) for s in (8, 12, 16)] == pytest.approx([0.55, 0.1, 0.1])   # the floor held


def test_optimizers_by_name_or_target():
    params = [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(optim.build(params, OptimConfig(name="sgd")), torch.optim.SGD)
    adam = optim.build(params, OptimConfig())
    assert isinstance(adam, torch.optim.AdamW) and [g["weight_decay"] for g in adam.param_groups] == [0.1, 0.0]
    custom = optim.build(params, OptimConfig(name="mine", _target_="torch.optim.Adagrad"))
    assert isinstance(custom, torch.optim.Adagrad)
    with pytest.raises(ConfigError, match="optim.name=lion: not a valid choice; valid choices: adamw, sgd"):
        optim.build(params, OptimConfig(name="lion"))


# -- data (in process) -------------------------------------------------------------------------------------

def test_token_batches_are_a_pure_function_of_seed_and_index(user_files):
    tokens = data_group.token_file(DataConfig(name="tokens", path=str(user_files.tokens)))
    a, b = data_group.TokenBatches(tokens, 4, 32, seed=1), data_group.TokenBatches(tokens, 4, 32, seed=1)
    assert torch.equal(a[7][0], b[7][0]) and not torch.equal(a[7][0], a[8][0])
    x, y = a[3]
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal((x[:, 1:] - x[:, :-1]) % 512, torch.full((4, 31), 3))   # the file counts by 3


def test_an_llmc_header_is_read(tmp_path):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240801, 7, 100)   # llm.c's Llama 3 files: uint32 ids
    path = tmp_path / "llmc.bin"
    path.write_bytes(header.tobytes() + np.arange(100, dtype=np.uint32).tobytes())
    tokens = data_group.token_file(DataConfig(name="tokens", path=str(path)))
    assert tokens.dtype == np.uint32 and len(tokens) == 100 and int(tokens[99]) == 99


def test_files_that_cannot_feed_the_run_are_refused_in_one_line(tmp_path, user_files):
    short = tmp_path / "short.bin"
    np.arange(10, dtype=np.uint16).tofile(short)
    with pytest.raises(ConfigError, match=r"10 token ids, shorter than one sequence \(train.seq_len \+ 1 = 65\)"):
        data_group.check(DataConfig(name="tokens", path=str(short)), 64, 512)
    with pytest.raises(ConfigError, match=r"65 token ids, shorter than one batch \(train.batch_size x \(train.seq_len "
                                          r"\+ 1\) = 8 x 65 = 520\)"):
        np.arange(65, dtype=np.uint16).tofile(short)
        data_group.check(DataConfig(name="tokens", path=str(short)), 64, 512, batch_size=8)
    with pytest.raises(ConfigError, match="holds token id 511, but the model's vocabulary has 256"):
        data_group.check(DataConfig(name="tokens", path=str(user_files.tokens)), 64, 256)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00" * 101)
    with pytest.raises(ConfigError, match="101 bytes is not a whole number of uint16 ids; nor of any dtype"):
        data_group.check(DataConfig(name="tokens", path=str(odd)), 4, 512)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    for path, message in ((empty, "an empty file (0 bytes)"), (tmp_path, "a directory; give a file of token ids")):
        with pytest.raises(ConfigError, match=re.escape(f"data.path={path}: {message}")):
            data_group.check(DataConfig(name="tokens", path=str(path)), 4, 512)


def test_a_datasets_folder_is_packed(user_files):
    pytest.importorskip("datasets")
    tokens = data_group.tokens_of(DataConfig(name="hf", path=str(user_files.dataset)))
    assert len(tokens) == 40 * 50 and int(tokens[50]) == 7   # row 1 starts at 7
    with pytest.raises(ConfigError, match="data.column=ids: no such column .*; valid choices: input_ids"):
        data_group.tokens_of(DataConfig(name="hf", path=str(user_files.dataset), column="ids"))


# -- refusals through the front door, in process (no directory made) ---------------------------------------

@pytest.mark.parametrize("args,line", [
    (["model=mine", "model._target_=nope.mod.build"],
     "model._target_=nope.mod.build: cannot import it (ModuleNotFoundError: No module named 'nope')"),
    (["data=tokens", "data.path=/nonexistent"], "data.path=/nonexistent: no such file or directory"),
    (["model=hf"], "model.config: give the path of a transformers config.json"),
    (["model=mine", "+model.dimm=3"], "mymodels.MLPLM(**{'vocab_size': 512, 'dim': 64, 'n_layers': 2, 'dimm': 3}) "
                                      "failed: MLPLM.__init__() got an unexpected keyword argument 'dimm'"),
    (["+metrics.collectors=[{_target_: mycollectors.Nope}]"], "metrics.collectors[0]._target_=mycollectors.Nope: "
                                                              "cannot import it"),
    (["+metrics.collectors=[{_target_: mymodels.MLPLM}]"], "metrics.collectors[0]: MLPLM has no on_step or summary()"),
    (["+metrics.collectors=[mycollectors.LossDrop]"], "metrics.collectors[0]='mycollectors.LossDrop': a collector is "
                                                      "a mapping with a _target_"),
])
def test_a_bad_model_or_data_is_one_line_before_any_directory(tmp_path, monkeypatch, capsys, user_files, args, line):
    code = main_in_process(monkeypatch, ["--config-dir", str(user_files.config_dir), *args,
                                         f"hydra.run.dir={tmp_path}/run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and line in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, text, line", [
    ("bad_baseline", None, "sweep.baseline=adam: no run of sweep bad_baseline has optim.name=adam; its runs have "
                           "optim.name = adamw, sgd"),
    ("listy", "- a\n- b\n", "listy.yaml: a sweep file is a mapping (defaults:, hydra:, sweep:, ...), not a list"),
    ("binary", b"\x7fELF\x02\x01\x01\x00\xff\xfe", "binary.yaml: not a text file"),
    ("headless", "", "headless.yaml: a sweep file begins with the line `# @package _global_`"),
])
def test_a_sweep_file_is_checked_whole_before_anything_trains(tmp_path, user_files, monkeypatch, capsys, name, text,
                                                              line):
    """In process (~1 s each): a user's sweep whose baseline is no run of its grid, a list, a binary file, one
    without Hydra's package header."""
    from ablate.sweeps.__main__ import main as sweeps_main

    (tmp_path / "sweeps").mkdir()
    mine = (user_files.config_dir / "sweeps" / "mysweep.yaml").read_text().replace("baseline: adamw", "baseline: adam")
    path = tmp_path / "sweeps" / f"{name}.yaml"
    headless = mine.replace("# @package _global_\n", "") if name == "headless" else None
    path.write_bytes(text if isinstance(text, bytes) else (headless or text or mine).encode())
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    monkeypatch.chdir(tmp_path)
    code = sweeps_main([name, "--config-dir", str(tmp_path), "--config-dir", str(user_files.config_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and line in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweeps"]   # nothing trained, no sweep dir


def test_a_yaml_mistake_names_the_file_the_key_and_the_problem(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "broken.yaml").write_text("_target_: mymodels.MLPLM\nvocab_size: 512\n  dim: 64\n")
    (tmp_path / "model" / "typo.yaml").write_text("defaults:\n  - base_llama\n  - _self_\ndimm: 64\n")
    with pytest.raises(ConfigError, match=r"model/broken.yaml line 3, column 6: not valid YAML \(mapping values"):
        config_of(["--config-dir", str(tmp_path), "model=broken"])
    with pytest.raises(ConfigError, match="model/typo.yaml: model.dimm: Key 'dimm' not in 'ModelConfig'"):
        config_of(["--config-dir", str(tmp_path), "model=typo"])


def test_plan_takes_the_config_dir_and_prints_activations(user_files, monkeypatch, capsys):
    from ablate import plan

    monkeypatch.syspath_prepend(str(user_files.module_dir))
    plan.main(["--config-dir", str(user_files.config_dir), "model=mine", "parallel=zero3", "launcher=slurm",
               "precision=bf16"])
    out = capsys.readouterr().out
    assert "model=mine" in out and "Activations per GPU: " in out


# -- end to end, once each ---------------------------------------------------------------------------------

def test_your_model_on_your_tokens_trains_with_6n_flops_and_an_mfu(tmp_path, monkeypatch, user_files):
    """In process (~4 s): the README's command, `--config-dir DIR model=mine data=tokens data.path=...`."""
    code = main_in_process(monkeypatch, ["--config-dir", str(user_files.config_dir), "model=mine", "data=tokens",
                                         f"data.path={user_files.tokens}", "logger=none", "train.steps=8",
                                         "train.warmup_steps=2", "train.log_every=4", "metrics.gemm_probe_n=128",
                                         "metrics.predict=false",
                                         f"hydra.run.dir={tmp_path}"])
    assert code == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["flops_per_token"] == pytest.approx(6 * MINE_MATMUL, rel=0.02) and s["flops_source"] == F.COUNTED
    assert has_mfu(s) and s["blocks"]["found_by"] == "rule" and s["vocab_size"] == 512
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[-1]["loss"] < rows[0]["loss"] and all(r["lr"] == 3e-3 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["fsdp2", "zero3"])
def test_your_model_on_two_ranks_resumes_exactly(tmp_path, user_files, parallel):
    """Three 2-rank runs (~60 s fsdp2, ~90 s zero3): a reference, one stopped by a planted failure at step 5
    after its step-4 checkpoint, and its resume, under warmup_cosine: the resume ends on the reference's loss."""
    common = ["--config-dir", str(user_files.config_dir), "model=mine", "data=tokens", f"data.path={user_files.tokens}",
              f"parallel={parallel}", "launcher.nproc_per_node=2", "logger=none", "train.steps=6",
              "train.warmup_steps=1", "train.log_every=2", "metrics.gemm_probe_n=128", "metrics.predict=false",
              "optim.schedule=warmup_cosine", "optim.warmup_steps=2"]
    env = {**planted(), "PYTHONPATH": f"{user_files.env['PYTHONPATH']}:{planted()['PYTHONPATH']}"}

    def run(name, *extra, environment=env):
        return run_cli([*common, *extra, f"hydra.run.dir={tmp_path / name}"], env=environment)

    assert run("reference").returncode == 0
    failing = {**env, **planted(failure="1:5"), "PYTHONPATH": env["PYTHONPATH"]}
    assert run("stopped", "train.checkpoint_every=2", environment=failing).returncode != 0
    resumed = run("resumed", f"train.resume={tmp_path / 'stopped'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ref = json.loads((tmp_path / "reference" / "summary.json").read_text())
    again = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert again["resumed_from_step"] == 4 and again["loss"] == pytest.approx(ref["loss"], abs=1e-5)
    assert ref["flops_per_token"] == pytest.approx(6 * MINE_MATMUL, rel=0.02) and has_mfu(ref)
    assert [r["step"] for r in read_jsonl(tmp_path / "resumed" / "metrics.jsonl")] == [6]


@pytest.mark.slow
def test_an_hf_llama_under_ddp_with_sgd_and_a_cosine_schedule(tmp_path, user_files):
    """One 2-rank run (~20 s): transformers' Llama from a config.json, DDP, SGD, lr rising then falling."""
    assert launch_in_process(["model=hf", f"model.config={user_files.hf_config}", "parallel=ddp",   # real ranks
                              "launcher.nproc_per_node=2", "optim=sgd", "optim.schedule=warmup_cosine",
                              "optim.warmup_steps=4", "logger=none", "train.steps=10", "train.warmup_steps=2",
                              "train.log_every=1", "metrics.gemm_probe_n=128",
                              "metrics.predict=false", f"hydra.run.dir={tmp_path}"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert has_mfu(s) and s["blocks"]["class"] == "LlamaDecoderLayer"
    assert s["flops_per_token"] == pytest.approx(F.training_flops(ModelConfig(), 1, 64).model, rel=0.01)
    lrs = [r["lr"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
    peak = lrs.index(max(lrs))
    assert peak == 3 and lrs[:peak + 1] == sorted(lrs[:peak + 1]) and lrs[peak:] == sorted(lrs[peak:], reverse=True)


@pytest.mark.slow
def test_your_config_dir_reaches_every_job_and_your_sweep_runs(tmp_path, user_files):
    """`-m --config-dir DIR model=mine,tiny` (two fresh processes, ~15 s) and `ablate.sweeps mysweep
    --config-dir DIR` (two runs and the report, ~20 s)."""
    grid = run_cli(["-m", "--config-dir", str(user_files.config_dir), "model=mine,tiny", "logger=none",
                    "train.steps=4", "train.warmup_steps=1", "metrics.gemm_probe_n=128", "metrics.predict=false",
                    f"hydra.sweep.dir={tmp_path / 'grid'}"], env=user_files.env)
    assert grid.returncode == 0, grid.stderr[-3000:]
    assert len(list((tmp_path / "grid").glob("*/summary.json"))) == 2
    swept = run_module("ablate.sweeps", ["mysweep", "--config-dir", str(user_files.config_dir), "--dir",
                                         str(tmp_path / "sweep"), "--", "logger=none", "metrics.gemm_probe_n=128",
                                         "metrics.predict=false"],
                       env=user_files.env)
    assert swept.returncode == 0, swept.stderr[-3000:]
    assert (tmp_path / "sweep" / "report.md").exists()
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "sweep").rglob("summary.json")]
    assert sorted(s["choices"]["optim"] for s in summaries) == ["adamw", "sgd"]
    # the sweep file's own collector (tests/user/mycollectors.py): every row, the summary, the report's CSV
    assert all(s["collected"] == ["loss_drop_total"] and s["loss_drop_total"] > 0 for s in summaries)
    rows = [r for p in (tmp_path / "sweep").rglob("metrics.jsonl") for r in read_jsonl(p)]
    assert rows and all(isinstance(r["loss_drop"], float) for r in rows)
    compared = {r["metric"]: r for r in csv.DictReader((tmp_path / "sweep" / "report.csv").open())}
    assert compared["loss_drop_total"]["effect_kind"] == "ratio" and compared["loss_drop_total"]["measured"]


def test_the_readme_shows_the_files_the_tests_train():
    """README's "Your model and data" quotes tests/user/ as it is (the module up to the tests' additions)."""
    import re

    from conftest import REPO

    readme = (REPO / "README.md").read_text().split("## Your model and data", 1)[1].split("\n## ", 1)[0]
    python, yaml_block = (re.search(rf"```{lang}\n(.*?)```", readme, re.S).group(1) for lang in ("python", "yaml"))
    assert python == (USER_DIR / "mymodels.py").read_text().split("\n\n# -- below")[0].rstrip() + "\n"
    assert yaml_block == (USER_DIR / "conf" / "model" / "mine.yaml").read_text()


def test_maxbatch_without_a_budget_takes_half_the_available_memory():
    from ablate.maxbatch import budget

    limit, rule = budget(None, cuda=False)
    assert limit > 0 and "half the memory available now" in rule


# -- the model's own arguments, and a model the probes cannot run ---------------------------------------------

def test_a_constructor_that_needs_max_seq_len_trains_and_a_longer_sequence_is_refused(tmp_path, monkeypatch,
                                                                                      capsys, user_files):
    """In process (~3 s): every key of the model file reaches the constructor (max_seq_len too); the vocabulary
    comes from the YAML for a module without a `vocab_size` attribute; train.seq_len past max_seq_len is one
    line, exit 2, no run dir."""
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    args = ["--config-dir", str(user_files.config_dir), "model=positional", "logger=none", "train.steps=8",
            "train.warmup_steps=2", "train.log_every=4", "metrics.gemm_probe_n=128", "metrics.predict=false"]
    assert main_in_process(monkeypatch, [*args, f"hydra.run.dir={tmp_path}/fits"]) == 0
    summary = json.loads((tmp_path / "fits" / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["vocab_size"] == 512
    capsys.readouterr()
    code = main_in_process(monkeypatch, [*args, "train.seq_len=128", f"hydra.run.dir={tmp_path}/long"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["ablate: error: train.seq_len=128: must be <= model.max_seq_len=64"], err
    assert not (tmp_path / "long").exists()


def builds_with_blocks(vocab_size=512, blocks=2):
    return torch.nn.Linear(vocab_size, vocab_size)


def test_a_constructor_argument_named_like_an_ablate_key_is_refused():
    cfg = UserModelConfig(target=f"{__name__}.builds_with_blocks", name="clash", args={"vocab_size": 512})
    with pytest.raises(ConfigError, match="takes `blocks`, a key of the model file that ablate reads itself"):
        build(cfg, "meta")


MIXTRAL = {"model_type": "mixtral", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
           "num_experts_per_tok": 2, "max_position_embeddings": 256, "tie_word_embeddings": False}


def test_a_mixture_of_experts_trains_and_says_how_its_flops_were_counted(tmp_path, monkeypatch):
    """A tiny transformers Mixtral (in process, ~4 s): its grouped matmul runs on neither meta nor fake tensors in
    fp32, so its FLOPs are counted on one real sequence (the experts each token uses: 6 x its active parameters,
    and attention, counted under SDPA's math backend: the CPU's fused kernel is invisible to the counter) and its
    activations are not planned; it trains."""
    pytest.importorskip("transformers")
    config = tmp_path / "mixtral.json"
    config.write_text(json.dumps(MIXTRAL))
    args = ["model=hf", f"model.config={config}", "logger=none", "train.steps=4", "train.warmup_steps=1",
            "train.log_every=2", "metrics.gemm_probe_n=128", "metrics.predict=false"]
    assert main_in_process(monkeypatch, [*args, f"hydra.run.dir={tmp_path}/run"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # active matmul weights per layer: q, o 64x64, k, v 64x32, the router 64x4, 2 of 4 experts' 3 64x128 matrices
    active = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 64 * 4 + 2 * 3 * 64 * 128) + 64 * 256
    assert summary["flops_source"].startswith("counted: torch.utils.flop_counter on one real sequence")
    assert summary["flops_per_token"] == pytest.approx(math_backend_count(config, 64) / 64, rel=0.01)
    assert summary["flops_per_token"] > 6 * active * 1.05   # attention's share is in
    assert summary["activation_bytes"] > 0 and summary["loss"] is not None


def math_backend_count(config, seq: int) -> float:
    """Training FLOPs of one sequence of the model in `config`, counted by torch's FlopCounterMode with SDPA's math
    backend (attention as matmuls), as the reference."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM

    import ablate.metrics.flops  # noqa: F401  (registers the grouped matmul's formula: 2 x K per output element)

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(config)))
    x = torch.zeros(1, seq, dtype=torch.long)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        logits = model(x).logits
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x.flatten()).backward()
    return float(counter.get_total_flops())


@pytest.mark.parametrize("edit, line", [
    (("  technique: optimizer choice", "  technique: optimizer choice\n  tecnique: typo"),
     "sweep.tecnique: no such key in sweep mysweep; valid keys: repeat, arm, name"),
    (("  baseline: adamw\n", ""), "sweep.baseline: sweep mysweep compares arms of sweep.knob=optim.name but names "
                                  "no baseline"),
    (("      optim: adamw,sgd", "      optim: adamw,sgd\n      train.stepz: 1,2"),
     "train.stepz: no such key in 'train'; valid keys: steps, "),
    (("effect: ratio", "effect: ratios"), "sweep.checks[0].effect=ratios: not a valid choice"),
])
def test_a_sweep_file_that_cannot_be_judged_is_refused_before_anything_trains(tmp_path, capsys, user_files, edit,
                                                                               line):
    """A user's sweep file with an unknown key, no baseline, an arm on a key no config has, a check of an unknown
    kind: ablate.sweeps exits 2 in one line with nothing written (in process, < 1 s each)."""
    from ablate.sweeps.__main__ import main as sweeps_main

    shutil.copytree(user_files.config_dir, tmp_path / "conf")
    path = tmp_path / "conf" / "sweeps" / "mysweep.yaml"
    path.write_text(path.read_text().replace(*edit))
    assert sweeps_main(["mysweep", "--config-dir", str(tmp_path / "conf"), "--dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0], err
    assert not (tmp_path / "out").exists()


def test_your_optimizer_file_is_built_as_written_and_recorded_as_built(tmp_path, monkeypatch, user_files):
    """In process (~2 s): DIR/optim/rms.yaml (`_target_: torch.optim.RMSprop`, lr 0.001, alpha 0.9) inherits
    nothing from adamw (its weight_decay 0.1 above all); summary.json names what was built, with its values."""
    args = ["--config-dir", str(user_files.config_dir), "optim=rms", "logger=none", "train.steps=4",
            "train.warmup_steps=1", "train.log_every=2", "metrics.gemm_probe_n=128",
            "metrics.predict=false", f"hydra.run.dir={tmp_path}"]
    assert main_in_process(monkeypatch, args) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    built = summary["optimizer"]
    assert built["class"] == "torch.optim.rmsprop.RMSprop" and summary["choices"]["optim"] == "rms"
    assert {k: built["hyperparameters"][k] for k in ("lr", "alpha", "weight_decay")} == {"lr": 0.001, "alpha": 0.9,
                                                                                        "weight_decay": 0}
    assert (tmp_path / "config.yaml").read_text().count("name: rms") == 1
    adamw = optim.describe(optim.build([torch.nn.Parameter(torch.zeros(2, 2))], OptimConfig()))
    assert adamw["class"] == "torch.optim.adamw.AdamW" and adamw["hyperparameters"]["betas"] == [0.9, 0.95]


@pytest.mark.slow
def test_your_config_dir_reaches_the_slurm_script_tune_and_maxbatch(tmp_path, monkeypatch, capsys, user_files):
    """In process: the dry-run sbatch script composes with the user's config dir again (< 1 s); ablate.tune
    (2 trials, ~10 s) and ablate.maxbatch (2 trials, ~8 s) take --config-dir and train the user's model."""
    from ablate.maxbatch import main as maxbatch_main
    from ablate.tune.__main__ import main as tune_main
    from conftest import drive_in_process

    conf = str(user_files.config_dir)
    assert main_in_process(monkeypatch, ["--config-dir", conf, "model=mine", "parallel=fsdp2", "launcher=slurm",
                                         "launcher.dry_run=true", f"hydra.run.dir={tmp_path / 'dry'}"]) == 0
    script = (tmp_path / "dry" / "sbatch.sh").read_text()
    assert f"'hydra.searchpath=[file://{user_files.config_dir.resolve()}]' model=mine" in script, script
    monkeypatch.setenv("PYTHONPATH", user_files.env["PYTHONPATH"])
    short = ["logger=none", "train.steps=4", "train.warmup_steps=1", "metrics.gemm_probe_n=128",
             "metrics.predict=false"]
    assert drive_in_process(tune_main, ["--config-dir", conf, "--space", "optim=adamw,rms", "--trials", "2", "--dir",
                                        str(tmp_path / "tune"), "--", "model=mine", *short]) == 0
    assert len(list((tmp_path / "tune").rglob("summary.json"))) == 2
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(user_files.module_dir))
    drive_in_process(maxbatch_main, ["--config-dir", conf, "--mem-budget-gb", "1", "--limit", "16", "--multiple-of",
                                     "8", "--", "model=positional", "logger=none"])
    found = json.loads(next((tmp_path / "runs" / "maxbatch").rglob("summary.json")).read_text())
    assert found["choices"]["model"] == "positional", found   # the user's model searched (its fit: the host's load)


@pytest.mark.slow
def test_a_stopped_run_resumes_in_place_from_anywhere_with_nothing_else_typed(tmp_path, user_files):
    """A 400-step run of the user's model stopped by SIGTERM (exit 143), then `python -m ablate train.resume=DIR`
    typed in another directory (two processes, ~20 s): the run's own config comes back from DIR/.hydra, it
    finishes in DIR, every step logged once, nothing written where the command was typed; an override that would
    change the run is refused in one line."""
    import signal
    import subprocess
    import time

    from conftest import AS_TYPED_IN_A_TERMINAL, COMMAND_ENV

    run, work = tmp_path / "run", tmp_path / "work"
    shutil.copytree(user_files.config_dir, work / "conf")   # typed with relative paths: a config dir, a token file
    shutil.copy(user_files.tokens, work / "train.bin")
    env = {**os.environ, **COMMAND_ENV, **user_files.env}
    first = subprocess.Popen([sys.executable, "-m", "ablate", "--config-dir", "conf", "model=positional",
                              "data=tokens", "data.path=train.bin", "logger=none", "train.steps=400",
                              "train.log_every=5", "dataloader.read_latency_ms=20", f"hydra.run.dir={run}"], cwd=work,
                             env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **AS_TYPED_IN_A_TERMINAL)
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").exists() or len(read_jsonl(run / "metrics.jsonl")) < 4:
        assert time.monotonic() < deadline and first.poll() is None, first.stderr.read() if first.poll() else ""
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=120) == 143
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = subprocess.run([sys.executable, "-m", "ablate", f"train.resume={run}"], cwd=elsewhere, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 400 and 0 < summary["resumed_from_step"] < 400
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(5, 401, 5))
    assert list(elsewhere.iterdir()) == []
    refused = subprocess.run([sys.executable, "-m", "ablate", f"train.resume={run}", "optim=sgd"], cwd=elsewhere,
                             env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"ablate: error: optim=sgd: train.resume={run} continues that run in place, as it was; optim would make it "
        "another run. Valid beside it: train.steps, optim.decay_steps, train.log_every, train.checkpoint_every, "
        "logger, metrics, launcher.wait; "
        "or continue into a new run with hydra.run.dir=NEW"], refused.stderr


@pytest.mark.slow
def test_a_sweep_of_yours_with_a_failing_arm_reports_what_happened(tmp_path, user_files):
    """tests/user/conf/sweeps/arms.yaml (three 6-step runs, ~16 s): two treatments against one baseline, one of which
    fails. The report names each row's arm, says "failed" for the failed one with its run dir and error, titles the
    user's sweep by its technique, and writes nothing of the week-4 claims into it."""
    out = tmp_path / "out"
    swept = run_module("ablate.sweeps", ["arms", "--config-dir", str(user_files.config_dir), "--dir", str(out), "--",
                                         "logger=none"], env=user_files.env)
    assert swept.returncode != 0 and "1 run(s) failed" in swept.stderr, swept.stderr[-2000:]
    report = (out / "report.md").read_text()
    failed = next(line for line in report.splitlines() if "**failed**" in line)
    assert "`fails` vs `mine`" in failed and f"{out}/arms/002_r0_model-fails: exit 1: RuntimeError" in failed
    assert "| `mine_tp` vs `mine` | tokens_per_s" in report
    assert "## two models against mine (`arms_fails`)" in report and "No claim:" in report
    assert "Claimed: ." not in report and "claims' arithmetic" not in report
