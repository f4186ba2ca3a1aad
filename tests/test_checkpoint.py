"""Checkpoints for every strategy: stop after step 4, resume to step 6, and get the losses of a run that
never stopped (real 2-rank runs for the distributed strategies)."""
import json

import pytest

from ablate.config import ConfigError
from conftest import launch_in_process, read_jsonl, run_in_process

COMMON = ["logger=none", "train.log_every=2", "train.warmup_steps=1", "metrics.gemm_probe_n=128",
          "metrics.predict=false"]


def test_single_process_resume_is_exact(tmp_path):
    reference = run_in_process(tmp_path / "ref", [*COMMON, "train.steps=6"])
    run_in_process(tmp_path / "first", [*COMMON, "train.steps=4", "train.checkpoint_every=4"])
    assert (tmp_path / "first" / "checkpoint" / "meta.pt").exists()
    resumed = run_in_process(tmp_path / "second", [*COMMON, "train.steps=6", f"train.resume={tmp_path / 'first'}"])
    assert resumed["resumed_from_step"] == 4
    assert resumed["loss"] == reference["loss"]
    assert [r["step"] for r in read_jsonl(tmp_path / "second" / "metrics.jsonl")] == [6]


@pytest.mark.slow
@pytest.mark.xdist_group("trained")   # the uninterrupted reference is the choice matrix's run of the strategy
# ddp here; fsdp2 and zero3 resume exactly in test_your_training.py (a rank failing at step 5 after its step-4
# checkpoint, under a schedule): the same checkpoint code, proven once per strategy (two 2-rank runs, ~40 s)
@pytest.mark.parametrize("parallel", ["ddp"])
def test_distributed_resume_matches_an_uninterrupted_run(tmp_path, parallel, trained):
    args = [*COMMON, "launcher.nproc_per_node=2", f"parallel={parallel}"]

    def run(name, *extra):   # launched from this process, as the matrix's reference (conftest.launch_in_process)
        assert launch_in_process([*args, *extra, f"hydra.run.dir={tmp_path / name}"]) == 0
        return json.loads((tmp_path / name / "summary.json").read_text())

    reference, _ = trained(parallel, "fp32", 2)   # 6 steps, as here (its measurement warm-up trains the same)
    run("first", "train.steps=4", "train.checkpoint_every=2")
    resumed = run("second", "train.steps=6", f"train.resume={tmp_path / 'first'}")
    assert resumed["resumed_from_step"] == 4
    assert resumed["loss"] == pytest.approx(reference["loss"], abs=1e-5)


def test_a_manifest_names_what_is_missing_cut_short_or_changed(tmp_path):
    from ablate.train import manifest

    ckpt = tmp_path / "checkpoint"
    (ckpt / "dcp").mkdir(parents=True)
    (ckpt / "meta.pt").write_bytes(b"meta")
    (ckpt / "dcp" / "__0_0.distcp").write_bytes(b"rank zero")
    (ckpt / "dcp" / "__1_0.distcp").write_bytes(b"rank one!")
    assert manifest.problem(tmp_path / "nothing") == "nothing is incomplete (no manifest.json)"
    assert manifest.problem(ckpt) == "checkpoint cannot be verified (no manifest.json, and no copy of it in " \
        "checkpoint_digests.json)"                                   # nothing vouches for its files: refused
    manifest.write(ckpt, step=6, world_size=2)
    listing = manifest.read(ckpt)
    assert (listing["step"], listing["world_size"], sorted(listing["files"])) == \
        (6, 2, ["dcp/__0_0.distcp", "dcp/__1_0.distcp", "meta.pt"])
    assert listing["files"]["meta.pt"] == {"bytes": 4, "crc32": 0xD7F21435}      # zlib.crc32(b"meta")
    assert manifest.problem(ckpt) is None
    (ckpt / "dcp" / "__1_0.distcp").write_bytes(b"rank one?")       # same size, other bytes
    assert manifest.problem(ckpt) == "checkpoint/dcp/__1_0.distcp does not match its checksum"
    assert manifest.problem(ckpt, checksums=False) is None
    assert manifest.problem(ckpt, share=0, shares=2) is None        # rank 0 checks files 0 and 2 of 3
    (ckpt / "dcp" / "__1_0.distcp").write_bytes(b"rank")
    assert manifest.problem(ckpt, share=1, shares=2) == "checkpoint/dcp/__1_0.distcp has 4 bytes, 9 were written"
    (ckpt / "dcp" / "__1_0.distcp").unlink()
    assert manifest.problem(ckpt) == "checkpoint/dcp/__1_0.distcp is missing"
    (ckpt / "manifest.json").unlink()   # its copy beside the checkpoints (the run dir) still verifies it
    assert manifest.problem(ckpt) == "checkpoint/dcp/__1_0.distcp is missing"
    (ckpt / "meta.pt").write_bytes(b"metb")   # another meta.pt: the copy is not this checkpoint's
    assert manifest.problem(ckpt).startswith("checkpoint cannot be verified")


def test_a_resume_on_more_ranks_lists_the_global_batch_it_changes():
    from ablate.train.resumable import check_resumable

    saved = {"train": {"steps": 10, "batch_size": 8, "grad_accum": 2, "lr": 0.003}, "parallel": {"name": "ddp"}}
    now = {"train": {"steps": 20, "batch_size": 8, "grad_accum": 2, "lr": 0.003}, "parallel": {"name": "ddp"}}
    assert check_resumable(saved, now, step=10, world=2, saved_world=1) == {"global_batch": [16, 32],  # 8 x 2 x ranks
                                                                            "world_size": [1, 2]}
    assert check_resumable(saved, now, step=10, world=2, saved_world=2) == {}
    fixed = {**now, "train": {**now["train"], "global_batch_size": 64}}
    assert check_resumable(saved, fixed, step=10, world=2, saved_world=1) == {"global_batch": [16, 64],
                                                                              "world_size": [1, 2]}


def test_a_resume_onto_another_mesh_records_the_strategy_the_world_and_the_mesh():   # in process, ~0 s
    """fsdp2 on 4 ranks -> hsdp 2 x 4 (both read DCP's checkpoint)."""
    from ablate.train.resumable import check_resumable

    saved = {"train": {"steps": 10, "batch_size": 8}, "parallel": {"name": "fsdp2"}}
    now = {"train": {"steps": 20, "batch_size": 8}, "parallel": {"name": "hsdp"}}
    meshes = ({"pp": 1, "dp_replicate": 1, "dp_shard": 4, "tp": 1},
              {"pp": 1, "dp_replicate": 2, "dp_shard": 4, "tp": 1})
    assert check_resumable(saved, now, step=10, world=8, saved_world=4, meshes=meshes) == {
        "global_batch": [32, 64], "parallel.name": ["fsdp2", "hsdp"], "world_size": [4, 8],
        "mesh": ["dp_shard 4", "dp_replicate 2 x dp_shard 4"]}


def test_a_resume_that_would_stretch_a_decaying_schedule_says_how_to_keep_it():   # in process, ~0 s
    from ablate.train.resumable import check_resumable

    saved = {"train": {"steps": 10}, "optim": {"schedule": "warmup_cosine"}, "parallel": {"name": "none"}}
    now = {"train": {"steps": 15}, "optim": {"schedule": "warmup_cosine"}, "parallel": {"name": "none"}}
    with pytest.raises(ConfigError, match="decayed over 10: its learning rate would rise again; keep its schedule "
                                          "with optim.decay_steps=10"):
        check_resumable(saved, now, step=10, world=1, saved_world=1)
    kept = {**now, "optim": {"schedule": "warmup_cosine", "decay_steps": 10}}
    assert check_resumable(saved, kept, step=10, world=1, saved_world=1) == {"optim.decay_steps": [None, 10]}
    constant = {"train": {"steps": 15}, "optim": {"schedule": "constant"}, "parallel": {"name": "none"}}
    assert check_resumable({**saved, "optim": {"schedule": "constant"}}, constant, 10, 1, 1) == {}


def test_a_resume_with_another_seed_or_sequence_length_lists_them():   # in process, ~0 s
    from ablate.train.resumable import check_resumable

    saved = {"train": {"steps": 10, "seed": 1, "seq_len": 64}, "parallel": {"name": "ddp"}}
    now = {"train": {"steps": 20, "seed": 2, "seq_len": 128}, "parallel": {"name": "ddp"}}
    assert check_resumable(saved, now, step=10, world=1, saved_world=1) == {
        "train.seed": [1, 2], "train.seq_len": [64, 128]}


def test_a_signal_at_the_last_step_says_the_run_is_complete_not_how_to_resume(tmp_path):   # in process, ~0 s
    import signal

    import torch

    from ablate.train.signals import stopped

    (tmp_path / "checkpoint").mkdir()
    for step, said in ((20, "the run is complete (step 20 of 20"), (12, "continue with train.resume=")):
        torch.save({"step": step, "config": {"train": {"steps": 20}}}, tmp_path / "checkpoint" / "meta.pt")
        line = stopped(signal.SIGINT, tmp_path)
        assert said in line and ("train.resume" in line) == (step < 20), line
