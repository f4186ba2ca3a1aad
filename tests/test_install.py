"""Installed like a user installs: the wheel `pip install .` builds, into a fresh venv (not editable, no
source tree on the path), then the commands from a directory that is not the checkout. The venv gets this
.venv's dependencies as links (torch & co., so nothing is downloaded) and nothing of ablate but the wheel."""
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("install")]   # one wheel built for the module


def dependencies_site(dest: Path) -> Path:
    """Links to every installed distribution but ablate itself (its editable hook included)."""
    dest.mkdir()
    for dist in metadata.distributions():
        if dist.metadata["Name"].lower() == "ablate":
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (dest / top).exists() and not top.startswith("__editable__"):
                (dest / top).symlink_to(source)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("install")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(root / "dist"), str(REPO)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((root / "dist").glob("ablate-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=300)
    python = root / "venv/bin/python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "dependencies.pth").write_text(str(dependencies_site(root / "deps")) + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                           "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    workdir = root / "elsewhere"
    workdir.mkdir()
    env = {"PATH": f"{python.parent}:{os.environ['PATH']}", "HOME": os.environ["HOME"],
           "ABLATE_CACHE_DIR": os.environ["ABLATE_CACHE_DIR"]}
    return python, workdir, env, wheel


def test_the_wheel_ships_the_configs_and_sweeps(installed):
    import zipfile

    names = zipfile.ZipFile(installed[3]).namelist()
    assert "ablate/conf/config.yaml" in names and "ablate/conf/parallel/zero3.yaml" in names
    assert "ablate/conf/sweeps/c3_no_sync.yaml" in names and "ablate/conf/sweeps/week4.yml" in names
    assert "hydra_plugins/ablate_launcher/fresh_process.py" in names


def test_python_m_ablate_trains_from_another_directory(installed):
    python, workdir, env, _ = installed
    where = subprocess.run(["python", "-c", "import ablate; print(ablate.__file__)"], cwd=workdir, env=env,
                           capture_output=True, text=True)
    assert str(REPO) not in where.stdout and "site-packages" in where.stdout, where.stdout + where.stderr
    done = subprocess.run(["python", "-m", "ablate", "train.steps=8", "train.warmup_steps=2"], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(workdir.glob("runs/*/*/summary.json"))


def test_the_ablate_command_and_the_sweeps_list(installed):
    _, workdir, env, _ = installed
    listed = subprocess.run(["python", "-m", "ablate.sweeps", "--list"], cwd=workdir, env=env,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and "c3_no_sync" in listed.stdout and "week4" in listed.stdout, listed.stderr
    refused = subprocess.run(["ablate", "precision=fp12"], cwd=workdir, env=env, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode == 2 and "valid choices: bf16, fp16, fp32, fp8" in refused.stderr
