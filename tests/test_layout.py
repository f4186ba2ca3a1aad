"""The code's shape (issue #19): conf/ mirrored in src/ablate/, a short top level, the rank environment read
in one module, imports going one way, and a single run's config composed once."""
import ast
import subprocess
import sys

import pytest

from ablate import CONF_DIR
from conftest import REPO, RUN_COMMON

PACKAGE = REPO / "src" / "ablate"
# what a launcher (torchrun, srun, submitit, ours) tells a rank about its place in the job
RANK_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "SLURM_PROCID",
                  "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID", "SLURM_JOB_ID", "SUBMITIT_EXECUTOR"}


def test_every_conf_group_has_its_module_or_package():
    groups = sorted(d.name for d in CONF_DIR.iterdir() if d.is_dir())
    assert len(groups) >= 10
    missing = [g for g in groups if not (PACKAGE / f"{g}.py").exists() and not (PACKAGE / g / "__init__.py").exists()]
    assert not missing, f"conf groups without src/ablate/<group>.py or <group>/: {missing}"


def test_the_top_level_holds_at_most_16_modules():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 16, modules


def test_the_rank_environment_is_read_in_one_module():
    readers = {}
    for path in PACKAGE.rglob("*.py"):
        names = {node.value for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Constant) and node.value in RANK_VARIABLES}
        if names:
            readers[str(path.relative_to(PACKAGE))] = sorted(names)
    assert list(readers) == ["train/ranks.py"], readers


def test_no_import_circles():
    tool = REPO.parent / "shared" / "tools" / "import_cycles.py"
    if not tool.exists():
        pytest.skip(f"the workplace's import-circle tool is not beside this checkout ({tool})")
    out = subprocess.run([sys.executable, str(tool), "src", "ablate"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "no import circles" in out.stdout, out.stdout


def test_a_single_run_is_composed_and_checked_once(tmp_path, monkeypatch):
    """`python -m ablate ...` in this process: Hydra's config loader runs once and the registries are
    checked once; the run still writes its record (and Hydra's .hydra/ beside it)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from ablate import __main__ as entry
    from ablate import compose

    composed, checked = [], []
    load, check = ConfigLoaderImpl.load_configuration, compose.check_choices
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration",
                        lambda self, *a, **k: composed.append(1) or load(self, *a, **k))
    monkeypatch.setattr(compose, "check_choices", lambda cfg: checked.append(1) or check(cfg))
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["ablate", *RUN_COMMON, f"hydra.run.dir={run_dir}"])
    entry.main()
    assert (len(composed), len(checked)) == (1, 1)
    assert (run_dir / "summary.json").exists() and (run_dir / ".hydra" / "overrides.yaml").exists()
    assert "logger=none" in (run_dir / ".hydra" / "overrides.yaml").read_text()
