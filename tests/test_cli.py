"""Bad input from the command line: one line naming the key and the choices, exit 2, no traceback,
nothing created or touched."""
import pytest

from conftest import run_cli

BAD = [
    (["precision=fp12"], "valid choices: bf16, fp16, fp32, fp8"),
    (["train.steps=-1"], "train.steps=-1"),
    (["train.grad_accum=0"], "train.grad_accum=0"),
    (["train.steps=abc"], "train.steps=abc"),
    (["model=huge"], "valid choices: 1b, 70b, 8b, small, tiny"),
    (["-m", "precision=fp32,fp13"], "precision=fp13"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_is_one_clean_line(tmp_path, args, needle):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "summary.json").write_text("{}")
    result = run_cli([*args, f"hydra.run.dir={tmp_path}/new", f"hydra.sweep.dir={tmp_path}/multi"])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ablate: error:") and needle in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "new").exists() and not (tmp_path / "multi").exists()
    assert (earlier / "summary.json").read_text() == "{}"


def test_fp8_on_a_cpu_is_refused_before_any_work(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_cli(["precision=fp8", f"hydra.run.dir={tmp_path}/new"])
    assert result.returncode == 2
    assert "compute capability >= 8.9" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "new").exists()
