"""Bad input from the command line: one line naming the key and the choices, exit 2, no traceback,
nothing created or touched."""
import pytest

from conftest import main_in_process, run_cli

BAD = [
    (["precision=fp12"], "valid choices: bf16, fp16, fp32, fp8"),
    (["train.steps=-1"], "train.steps=-1"),
    (["train.grad_accum=0"], "train.grad_accum=0"),
    (["train.steps=abc"], "train.steps=abc"),
    (["model=huge"], "valid choices: 1b, 405b, 70b, 8b, deepseek_moe_16b, hf, mixtral_8x7b, moe_small, moe_tiny, "
                     "small, tiny"),
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


@pytest.mark.parametrize("args,needle", [
    (["optim.lr=nan"], "optim.lr=nan: out of range; allowed: a finite number > 0"),
    (["dataloader=pinned", "dataloader.prefetch_factor=0"],
     "dataloader.prefetch_factor=0: out of range; allowed: >= 1"),
    (["+train.lrr=1"], "train.lrr: no such key in 'train'"),
])
def test_more_bad_values_are_one_line(tmp_path, args, needle):
    result = run_cli([*args, f"hydra.run.dir={tmp_path}/new"])
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert needle in result.stderr and not (tmp_path / "new").exists()


def test_a_users_own_config_dir_adds_choices(tmp_path, monkeypatch):
    """The run in this process (main(), as `python -m ablate` calls it); the refusal typed."""
    mine = tmp_path / "conf" / "model"
    mine.mkdir(parents=True)
    (mine / "mine.yaml").write_text("name: mine\ndim: 32\nn_layers: 1\nn_heads: 2\nn_kv_heads: 1\nffn_hidden: 64\n")
    code = main_in_process(monkeypatch, ["--config-dir", str(tmp_path / "conf"), "model=mine", "logger=none",
                                         "train.steps=3", "train.warmup_steps=1", "metrics.gemm_probe_n=64",
                                         "metrics.predict=false",
                                         f"hydra.run.dir={tmp_path}/run"])
    assert code == 0
    assert (tmp_path / "run" / "summary.json").exists()
    wrong = run_cli(["--config-dir", str(tmp_path / "conf"), "model=nine", f"hydra.run.dir={tmp_path}/x"])
    assert wrong.returncode == 2 and ("valid choices: 1b, 405b, 70b, 8b, deepseek_moe_16b, hf, mine, mixtral_8x7b, "
                                                "moe_small, moe_tiny, small, tiny") in wrong.stderr


def test_hydras_own_flags_pass_through(tmp_path):
    completion = run_cli(["-sc", "install=bash"])
    assert completion.returncode == 0 and "hydra_bash_completion" in completion.stdout
    helped = run_cli(["--help"])
    assert helped.returncode == 0 and "sweeps: " in helped.stdout and ".venv" not in helped.stdout


@pytest.mark.parametrize("module", ["ablate.plan", "ablate.sweeps", "ablate.report", "ablate.maxbatch",
                                    "ablate.baseline"])
def test_every_command_has_help(module):
    import subprocess
    import sys

    from conftest import REPO

    result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0 and "usage" in result.stdout.lower() and "Traceback" not in result.stderr


def test_sweeps_list_names_claim_knob_and_arms():
    import subprocess
    import sys

    from conftest import REPO

    result = subprocess.run([sys.executable, "-m", "ablate.sweeps", "--list"], cwd=REPO, capture_output=True,
                            text=True)
    assert result.returncode == 0
    assert "c3_no_sync" in result.stdout and "knob: parallel.no_sync; arms: parallel=ddp_sync,ddp" in result.stdout


def test_a_bug_keeps_its_traceback_and_is_never_dressed_as_a_config_error(tmp_path, monkeypatch):
    """An exception of ablate's own code while composing (a bug, not the user's input) leaves main() as itself,
    with its traceback; only Hydra's and OmegaConf's errors and ablate's typed ones become one line. In
    process: costs ~1 s."""
    from ablate import compose

    def broken(cfg):
        raise RuntimeError("a bug in ablate")

    monkeypatch.setattr(compose, "check_choices", broken)
    with pytest.raises(RuntimeError, match="a bug in ablate") as raised:
        main_in_process(monkeypatch, ["logger=none", f"hydra.run.dir={tmp_path}/run"])
    assert raised.traceback[-1].name == "broken"         # where it was raised, not where it was caught
    assert not (tmp_path / "run").exists()


def test_library_code_raises_and_only_the_entry_points_exit():
    """No SystemExit, sys.exit or os._exit in ablate's library modules: the entry points (`__main__.py` files) map
    typed errors to exit codes; a spawned rank's own top (launcher/local.py),
    a requeued Slurm task that must leave without unwinding (train/signals.py) and a sweep's driver leaving as
    Slurm requeues its job (sweeps/allocation.py) are the documented exceptions."""
    import re

    from conftest import REPO

    allowed = {"__main__.py", "sweeps/__main__.py", "report/__main__.py", "baseline/__main__.py", "tune/__main__.py",
               "check/__main__.py", "plan/__main__.py", "maxbatch/__main__.py", "calibrate/__main__.py",
               "launcher/local.py", "train/signals.py", "sweeps/allocation.py"}
    package = REPO / "src" / "ablate"
    found = {str(p.relative_to(package)) for p in package.rglob("*.py")
             if re.search(r"SystemExit|sys\.exit\(|os\._exit\(", p.read_text())}   # the before-stop hook's test
    assert found <= allowed, found - allowed


@pytest.mark.parametrize("args,line", [
    (["nope"], "ablate.sweeps: error: no sweep 'nope'; valid choices: aa_noise, "),
    (["c3_no_sync", "--repeats", "x"], "ablate.sweeps: error: --repeats=x: valid choices: an integer >= 1, or auto"),
    ([], "ablate.sweeps: error: give at least one sweep name; valid choices: aa_noise, "),
])
def test_a_bad_sweeps_command_is_one_line_and_exit_2(args, line, capsys):
    """In process (ablate.sweeps' main), ~0.1 s each: one line naming the option and what it takes, no usage."""
    from ablate.sweeps.__main__ import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(line), err
