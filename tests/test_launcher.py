"""launcher=slurm without a cluster: the dry run's script, and the refusal when Slurm is missing."""
from conftest import run_cli


def test_dry_run_writes_the_8_by_8_by_8_script(tmp_path):
    result = run_cli(["launcher=slurm", "launcher.dry_run=true", "parallel=zero3", "nccl=tuned",
                      "allocator=expandable", f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-2000:]
    script = (tmp_path / "sbatch.sh").read_text()
    for line in ("#SBATCH --nodes=8", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --signal=USR2@90", "export NCCL_ALGO=RING",
                 "export PYTORCH_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128"):
        assert line in script
    assert str(tmp_path / "sbatch.sh") in result.stdout
    assert not (tmp_path / "slurm").exists()   # nothing submitted


def test_slurm_missing_is_one_line(tmp_path):
    result = run_cli(["launcher=slurm", "parallel=ddp", f"hydra.run.dir={tmp_path}/run"], env={"PATH": "/nonexistent"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "sbatch not found" in result.stderr and not (tmp_path / "run").exists()


def test_the_dry_run_needs_no_slurm_installed(tmp_path):
    result = run_cli(["launcher=slurm", "launcher.dry_run=true", "parallel=ddp", f"hydra.run.dir={tmp_path}"],
                     env={"PATH": "/nonexistent"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "#SBATCH --nodes=8" in (tmp_path / "sbatch.sh").read_text()
