"""bench/gpu_week4.sh's install on a box like the GPU one: a fresh venv that has only the GPU image's
packages (bench/gpu_image_packages.txt, taken from this .venv: torch, numpy, rich, ...), none of Hydra,
and the wheels bench/fetch_wheels.sh makes, installed with --no-index. Then a real run with that install."""
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bench")]   # one venv built for the module


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_site(dest: Path) -> Path:
    """A folder of links to this venv's installs of the GPU image's packages (and nothing else)."""
    wanted = {_normal(n) for n in (REPO / "bench/gpu_image_packages.txt").read_text().split() if not n.startswith("#")}
    dest.mkdir()
    for dist in metadata.distributions():
        if _normal(dist.metadata["Name"]) not in wanted:
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source = Path(dist.locate_file(top))   # its package folder, module file or dist-info
            if source.exists() and not (dest / top).exists():
                (dest / top).symlink_to(source)
    return dest


@pytest.fixture(scope="module")
def gpu_like(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_like")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    python = root / "venv/bin/python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "gpu_image.pth").write_text(str(image_site(root / "image")) + "\n")
    wheels = root / "wheels"
    fetched = subprocess.run(["bash", str(REPO / "bench/fetch_wheels.sh"), str(wheels)], capture_output=True,
                             text=True, timeout=600)
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    return python, wheels, root


def _bench(python, wheels, site, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PY=str(python), WHEELS=str(wheels), SITE=str(site))
    return subprocess.run(["bash", str(REPO / "bench/gpu_week4.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=600, cwd=REPO)


def test_the_image_alone_lacks_hydra_and_the_script_says_what_to_carry(gpu_like):
    python, _, root = gpu_like
    probe = subprocess.run([str(python), "-c", "import torch, numpy, rich, yaml; import hydra"], capture_output=True,
                           text=True)
    assert "No module named 'hydra'" in probe.stderr      # torch and the rest came from the image's set
    result = _bench(python, root / "no-wheels", root / "site0", "--install-only")
    assert result.returncode == 1 and "run bash bench/fetch_wheels.sh" in result.stderr


def test_the_wheels_install_offline_and_a_run_works_with_them(gpu_like, tmp_path):
    python, wheels, root = gpu_like
    site = root / "site"
    result = _bench(python, wheels, site, "--install-only")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "(--no-index)" in result.stdout and "imports ok: hydra 1.3.8 omegaconf 2.3.1" in result.stdout
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(PYTHONPATH=f"{site}:{REPO / 'src'}", WANDB_MODE="offline")
    run = subprocess.run([str(python), "-m", "ablate", "logger=none", "train.steps=3", "train.warmup_steps=1",
                          "metrics.gemm_probe_n=128",
                          "metrics.predict=false", f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True,
                         text=True, env=env, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").exists()


def test_a_smoke_run_brings_its_results_home_in_a_few_files(tmp_path):
    """What the device tool returns: at most 8 files from OUT, none more than 2 folders down, plain names.
    Two rows at toy scale on this CPU (ROWS; all four by hand: 19 summaries, 2 min 41 s): one archive holding
    every run dir and the report, the report beside it."""
    import tarfile

    out = tmp_path / "OUT"
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
           "SMOKE": "1", "PY": sys.executable, "WORK": str(tmp_path / "work"), "ROWS": "c6_pinned c1_mfu"}
    done = subprocess.run(["bash", str(REPO / "bench/gpu_week4.sh"), str(out)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=REPO)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(f.parts) <= 3 for f in files), files
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", part) for f in files for part in f.parts), files
    assert (out / "report.md").read_text().startswith("#") and (out / "report.csv").exists()
    with tarfile.open(out / "results.tar.gz") as archive:
        names = archive.getnames()
    assert sum(n.endswith("/summary.json") for n in names) == 4 and "./report.md" in names
    assert any("c6_pinned/" in n for n in names) and any("c1_mfu/" in n for n in names)
