"""Mixtures of experts on the mesh (config/moe.py, model/moe.py, parallel/ep.py, metrics/experts.py; docs/layouts.md,
"Experts"): the router and balance loss in process; one ep x tp run judged by ablate.check against one rank, one ep
run with its figures, resumed on another ep (~90 s in all, the runs on 4 gloo ranks)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from ablate.compose import preflight
from ablate.config import ConfigError, ModelConfig
from ablate.config.dims import described, in_use, label
from ablate.config.moe import MoEConfig
from ablate.metrics.flops import FlopModel
from ablate.model.facts import counted_flops
from ablate.model.llama import Transformer
from ablate.model.moe import balance_loss
from conftest import COMMAND_ENV, REPO, run_cli

MOE = ["model=moe_tiny", "parallel=fsdp2", "launcher.nproc_per_node=4"]


def test_each_token_meets_k_experts_and_a_capacity_drops_the_rest():
    torch.manual_seed(0)
    net = Transformer(ModelConfig(moe=MoEConfig(experts=8, top_k=2, hidden=96)))
    net(torch.randint(0, 256, (2, 16)))
    mixture = net.layers[0].feed_forward
    assert int(mixture.load.sum()) == 2 * 16 * 2 and mixture.dropped == 0
    capped = Transformer(ModelConfig(moe=MoEConfig(experts=8, top_k=2, hidden=96, capacity_factor=0.5)))
    capped(torch.randint(0, 256, (2, 16)))
    mixture = capped.layers[0].feed_forward
    assert mixture.dropped >= 64 - 8 * 4   # at most ceil(0.5 x 64 / 8) = 4 slots an expert kept


def test_the_balance_loss_is_a_mean_over_sequences_as_data_parallel_ranks_sum_it():
    """DeepSeek-V3's sequence-wise loss: two ranks' halves average to the whole batch's exactly (what lets ep and dp
    train one rank's loss)."""
    torch.manual_seed(0)
    probs = torch.rand(4 * 8, 6).softmax(-1)
    chosen = probs.topk(2, dim=-1).indices
    whole = balance_loss(probs, chosen, 4, 6)
    halves = [balance_loss(probs[i * 16:(i + 1) * 16], chosen[i * 16:(i + 1) * 16], 2, 6) for i in range(2)]
    assert whole == pytest.approx(sum(halves) / 2)
    even = torch.full((8, 4), 0.25)
    assert balance_loss(even, torch.arange(8).remainder(4).view(8, 1), 1, 4) == pytest.approx(1.0)


@pytest.mark.parametrize("checkpointing", [False, True, 2])
def test_the_flop_model_counts_the_active_experts_as_the_counter_does(checkpointing):
    cfg = ModelConfig(attention="math", n_layers=4, activation_checkpointing=checkpointing,
                      moe=MoEConfig(experts=8, top_k=2, hidden=96, shared_experts=1))
    assert counted_flops(cfg, 64, True) == FlopModel.analytic(cfg).training(64, 64 * 64).hardware


def test_ep_is_recorded_where_it_splits_and_carved_from_dp_shard():
    mesh = {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "tp": 1, "ep": 2}
    assert label(mesh) == "1x1x4x1 ep2" and label({**mesh, "ep": 1}) == "1x1x4x1"
    assert in_use(mesh) == "dp_shard 4 x ep 2" and described(mesh).endswith("(ep 2 within dp_shard)")


@pytest.mark.parametrize("args,said", [
    (["model=tiny", "parallel.ep=2"], "parallel.ep=2: model=tiny has no experts"),
    (["parallel=zero2", "parallel.ep=2"], "parallel=zero2 with parallel.ep=2"),
    (["parallel.ep=3"], "valid choices: 1, 2, 4"),
    (["model.moe.top_k=9"], "model.moe.top_k=9: more than the 8 experts"),
    (["model.activation_checkpointing=selective"], "selective with model.moe"),
    (["parallel.pp=2", "parallel.ep=2"], "the earlier stages' balance losses would not reach it"),
    (["parallel=zero2", "model.moe.balance=bias"], "model.moe.balance=bias with parallel=zero2"),
])
def test_what_experts_cannot_do_is_refused_in_one_line(args, said, tmp_path):
    """Each before any rank starts (in process, as the entry point's preflight checks it)."""
    with pytest.raises(ConfigError, match=re.escape(said)) as refused:
        preflight([*MOE, *args, f"hydra.run.dir={tmp_path}/x"])
    assert "\n" not in str(refused.value) and not (tmp_path / "x").exists()


def test_a_model_of_your_own_says_its_experts_as_an_argument_transformers_names(tmp_path):
    """model=mine_moe (tests/user: `num_experts: 4`, an argument of its constructor) is laid out with ep before
    launch, and an ep not dividing it is refused naming the valid ones; a dense model of one's own is told which
    argument says it (in process)."""
    from ablate import parallel
    from ablate.compose import config_of
    from conftest import USER_DIR

    own = [f"--config-dir={USER_DIR / 'conf'}", "parallel=fsdp2", "launcher.nproc_per_node=4"]
    assert parallel.layout_of(config_of([*own, "model=mine_moe", "parallel.ep=2"])[1]).ep == 2
    with pytest.raises(ConfigError, match=re.escape("model.num_experts=4; valid choices: 1, 2, 4")):
        preflight([*own, "model=mine_moe", "parallel.ep=3", f"hydra.run.dir={tmp_path}/x"])
    with pytest.raises(ConfigError, match="an argument named num_local_experts or num_experts or n_routed_experts"):
        preflight([*own, "model=mine", "parallel.ep=2", f"hydra.run.dir={tmp_path}/y"])


def test_a_refusal_is_one_line_and_exit_2_and_names_the_models_with_experts(tmp_path):
    """The command a user types (~3 s)."""
    done = run_cli(["model=tiny", "parallel=fsdp2", "parallel.ep=2", "launcher.nproc_per_node=2",
                    f"hydra.run.dir={tmp_path}/x"])
    assert done.returncode == 2 and "moe_tiny, moe_small, mixtral_8x7b" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_experts_split_over_ep_and_layers_over_tp_train_the_one_rank_loss(tmp_path):
    """ep 2 x tp 2 on 4 ranks, dropless, fp32, 8 steps, the experts balanced by a bias (its load summed over the
    data-parallel ranks, so that every rank moves it alike): the losses of one rank with the same global batch, and
    the planned peak the measured one's (~45 s)."""
    done = subprocess.run([sys.executable, "-m", "ablate.check", "--dir", str(tmp_path), *MOE, "parallel.ep=2",
                           "parallel.tp=2", "model.moe.balance=bias", "model.moe.bias_update=0.05"], cwd=REPO,
                          env={**os.environ, **COMMAND_ENV}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "same: 8 steps" in done.stdout, done.stdout + done.stderr
    summary = json.loads((tmp_path / "layout" / "summary.json").read_text())
    assert summary["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 2, "ep": 2}
    # the plan keeps a mixture's activations whole on each tp rank (its input gathered), the rest split; its router
    # balanced, it plans the ranks' mean (the ranks whose experts the router favours peak higher: 11.6 / 8.0 MB)
    ranks = [r["peak_bytes_measured"] for r in summary["per_rank"]]
    assert summary["peak_bytes_planned"] == pytest.approx(sum(ranks) / len(ranks), rel=0.1)


@pytest.mark.slow
def test_an_ep_run_records_its_experts_and_resumes_on_another_ep(tmp_path, fast):
    """fsdp2 x ep 2 on 4 ranks with a checkpoint, then resumed at ep 4 (~40 s): the routing's figures, ep's bytes
    as the comm model says (the mean over the ranks), the active parameters."""
    done = run_cli([*MOE, "parallel.ep=2", "logger=none", *fast, "train.steps=4", "train.checkpoint_every=2",
                    f"hydra.run.dir={tmp_path}/a"])
    assert done.returncode == 0, done.stderr
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["comm_bytes_by_dim"]["ep"] == s["modeled"]["comm_bytes_by_dim.ep"] > 0
    assert s["comm_bytes_by_dim"]["dp_shard"] == pytest.approx(s["modeled"]["comm_bytes_by_dim.dp_shard"], rel=1e-3)
    assert 1.0 <= s["moe_load_imbalance"] <= 4.0 and s["moe_dropped_frac"] == 0 and s["moe_aux_loss"] > 0
    assert s["params_active"] == s["params"] - 2 * 8 * 3 * 64 * 96 * 6 // 8
    assert len(s["moe"]["load_by_layer"]) == 2 and "comm_bytes_by_dim.ep" in s["notes"]
    again = run_cli([*MOE, "parallel.ep=4", "logger=none", *fast, f"train.resume={tmp_path}/a",
                     f"hydra.run.dir={tmp_path}/b"])
    assert again.returncode == 0, again.stderr
    resumed = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert resumed["resumed_from_step"] == 4 and resumed["mesh"]["ep"] == 4


def test_a_factorial_level_null_is_written_as_the_command_line_writes_it():
    from ablate import design

    points = design.build({"model.moe.capacity_factor": [None, 1.25], "model.moe.top_k": [2, 1]}).points
    assert {design.Design({}, []).overrides(p)[0] for p in points} == {"model.moe.capacity_factor=null",
                                                                      "model.moe.capacity_factor=1.25"}


@pytest.mark.slow
def test_a_transformers_mixtral_splits_its_experts_over_ep_and_trains_one_ranks_loss(tmp_path):
    """A tiny transformers Mixtral at ep 2 on 2 ranks (its mixtures found by rule: `experts.num_experts`): its own
    experts' forward runs each rank's half, the slots sent by all-to-all; the losses of one rank (~40 s)."""
    pytest.importorskip("transformers")
    from test_your_training import MIXTRAL

    config = tmp_path / "mixtral.json"
    config.write_text(json.dumps(MIXTRAL))
    done = subprocess.run([sys.executable, "-m", "ablate.check", "--dir", str(tmp_path / "c"), "model=hf",
                           f"model.config={config}", "parallel=fsdp2", "parallel.ep=2", "launcher.nproc_per_node=2"],
                          cwd=REPO, env={**os.environ, **COMMAND_ENV}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "same: 8 steps" in done.stdout, done.stdout + done.stderr
    summary = json.loads((tmp_path / "c" / "layout" / "summary.json").read_text())
    assert summary["mesh"]["ep"] == 2 and summary["comm_bytes_by_dim"]["ep"] > 0
    # FSDP gathers and reduce-scatters (3 x 4 B a parameter) all but the experts (2 layers x 4 x 3 x 64 x 128),
    # whose 2 a rank are whole on it (dp_shard / ep = 1)
    experts = 2 * 4 * 3 * 64 * 128
    assert summary["comm_bytes_by_dim"]["dp_shard"] == pytest.approx(12 * (summary["params"] - experts), rel=1e-3)
