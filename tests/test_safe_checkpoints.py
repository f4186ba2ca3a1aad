"""Checkpoints execute nothing (#33): a pickle planted in DCP's .metadata or a DeepSpeed state is refused by
the restricted readers before any loader opens it. In process on files written here (~1 s), and one real
fsdp2 resume past a planted .metadata (2 runs, ~25 s)."""
import json
import os
import pickle

import pytest
import torch

from ablate.train import manifest
from ablate.train.pickles import unsafe
from conftest import run_cli


class Planted:
    """What an attacker writes: unpickling it would create a file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_dcp_metadata_is_read_by_an_allow_list(tmp_path):
    import torch.distributed.checkpoint as dcp

    checkpoint = tmp_path / "checkpoint"
    dcp.save({"w": torch.zeros(3)}, checkpoint_id=str(checkpoint / "dcp"), no_dist=True)
    assert unsafe(checkpoint) is None
    (checkpoint / "dcp" / ".metadata").write_bytes(pickle.dumps({"m": Planted(tmp_path / "ran")}))
    assert unsafe(checkpoint) == "dcp/.metadata names posix.system, which a checkpoint never needs: not loaded"
    assert not (tmp_path / "ran").exists()


def test_deepspeed_states_are_loaded_weights_only(tmp_path):
    from deepspeed.runtime.zero.config import ZeroStageEnum

    states = tmp_path / "checkpoint" / "deepspeed" / "latest"
    states.mkdir(parents=True)
    torch.save({"zero_stage": ZeroStageEnum.weights, "w": torch.ones(2)}, states / "zero_pp_rank_0_model_states.pt")
    assert unsafe(tmp_path / "checkpoint") is None
    torch.save({"x": Planted(tmp_path / "ran")}, states / "zero_pp_rank_0_model_states.pt")
    assert "names posix.system, which a checkpoint never needs" in unsafe(tmp_path / "checkpoint")
    assert not (tmp_path / "ran").exists()


@pytest.mark.slow
def test_a_planted_metadata_pickle_does_not_run_on_resume(tmp_path):
    """fsdp2, one process: checkpoints at steps 2 and 4; the latest .metadata replaced by a pickle that would
    create a file, its manifest refreshed (a CRC is no protection); the resume falls back to step 2."""
    common = ["parallel=fsdp2", "logger=none", "train.warmup_steps=1", "train.log_every=2", "metrics.gemm_probe_n=64",
              "metrics.predict=false"]
    first = run_cli([*common, "train.steps=4", "train.checkpoint_every=2", f"hydra.run.dir={tmp_path / 'a'}"])
    assert first.returncode == 0, first.stderr[-2000:]
    latest = tmp_path / "a" / "checkpoint"
    (latest / "dcp" / ".metadata").write_bytes(pickle.dumps({"m": Planted(tmp_path / "ran")}))
    meta = manifest.read(latest)
    manifest.write(latest, meta["step"], meta["world_size"])
    resumed = run_cli([*common, "train.steps=6", f"train.resume={tmp_path / 'a'}", f"hydra.run.dir={tmp_path / 'b'}"])
    assert not (tmp_path / "ran").exists()
    assert "Traceback" not in resumed.stderr
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["resumed_from_step"] == 2
    assert "names posix.system, which a checkpoint never needs" in resumed.stderr


def test_rotation_checks_checksums_so_a_corrupt_latest_never_becomes_prev(tmp_path):
    """Same size, other bytes: sizes would pass it; its CRC does not, so it is set aside, never the prev."""
    from ablate.train import checkpoint

    class OneFile:   # the strategy's part of a checkpoint: one file of state
        def save_checkpoint(self, directory):
            (directory / "model_optimizer.pt").write_bytes(b"state" * 20)

    target = tmp_path / "checkpoint"
    checkpoint.save(target, OneFile(), 2, {"world_size": 1}, is_main=True)
    checkpoint.save(target, OneFile(), 4, {"world_size": 1}, is_main=True)
    assert (tmp_path / "checkpoint.prev").is_dir()
    (target / "model_optimizer.pt").write_bytes(b"STATE" * 20)           # corrupted in place, same size
    checkpoint.save(target, OneFile(), 6, {"world_size": 1}, is_main=True)
    assert (tmp_path / "checkpoint.broken").is_dir()
    assert checkpoint.read_meta(tmp_path / "checkpoint.prev")["step"] == 2   # the intact one stays the prev


@pytest.mark.parametrize("torn", ["meta.pt", "manifest.json"])
def test_a_truncated_latest_falls_back_to_the_whole_previous_one(tmp_path, torn):
    """In process (~3 s): a run checkpointing at steps 2 and 4, its latest meta.pt or manifest.json cut in
    half; the resume is judged on, and continues from, step 2, with no traceback."""
    from ablate.train import checkpoint
    from conftest import run_in_process

    common = ["train.warmup_steps=1", "train.log_every=2", "metrics.gemm_probe_n=64", "metrics.predict=false"]
    run_in_process(tmp_path / "a", [*common, "train.steps=4", "train.checkpoint_every=2"])
    latest = tmp_path / "a" / "checkpoint" / torn
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])
    assert checkpoint.manifest.problem(tmp_path / "a" / "checkpoint") is not None
    resumed = run_in_process(tmp_path / "b", [*common, "train.steps=6", f"train.resume={tmp_path / 'a'}"])
    assert resumed["resumed_from_step"] == 2


def test_a_truncated_deepspeed_state_is_judged_by_its_size_and_the_previous_one_used(tmp_path):
    """In process (~0 s): a zero3-like checkpoint whose latest model_states.pt is cut short: its size is checked
    before any loader (the pickle check's included) opens it, and the whole previous checkpoint is the one used."""
    from ablate.train import checkpoint

    for name, step in (("checkpoint.prev", 2), ("checkpoint", 4)):
        states = tmp_path / name / "deepspeed" / "latest"
        states.mkdir(parents=True)
        torch.save({"w": torch.ones(100_000)}, states / "zero_pp_rank_0_model_states.pt")
        torch.save({"step": step, "world_size": 1}, tmp_path / name / "meta.pt")
        manifest.write(tmp_path / name, step, 1)
    latest = tmp_path / "checkpoint" / "deepspeed" / "latest" / "zero_pp_rank_0_model_states.pt"
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 10])   # (torch.load: OSError EINVAL)
    assert "cannot be read" in unsafe(tmp_path / "checkpoint")   # the pickle check alone says so, no traceback
    assert "zero_pp_rank_0_model_states.pt" in manifest.problem(tmp_path / "checkpoint", checksums=False)
    checkpoint.check_complete(tmp_path / "checkpoint")            # the previous one is whole: a resume goes on
    assert checkpoint.newest_whole(tmp_path / "checkpoint") == tmp_path / "checkpoint.prev"
