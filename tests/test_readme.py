"""The documentation is the test list: every command in the `bash` and `console` blocks of README.md,
docs/tune.md, docs/baseline.md and sweeps/README.md, typed as a user types it — from a directory outside the
checkout, in an environment with only PATH and HOME (no rank, Slurm or W&B variables; one OpenMP thread in the
parallel tier), with the installed `python` — in the order written.
The only change is appending a few training steps to what trains (SHORT); a command added to a block is
covered without a test written for it. `bash` lines must exit 0 without a traceback; a `console` block's
`$ ` lines must print exactly the line documented under them, exit 2 and leave no directory behind.
`make` lines are CI's own (`make test` is this suite; `make run` is `python -m ablate`, typed below)."""
import csv
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from conftest import REPO

# the commands share a user directory, in order, on one worker: each chain of commands that reads what another made
# (the c3 sweep, its report and the gate that reads it; the tune) is a group of its own, the rest one more
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("readme")]


def chain_of(line: str) -> str:
    """The worker group of a documented command: the commands it reads the results of run on its worker."""
    if "sweeps_out/c3" in line:
        return "readme_c3"
    return "readme_tune" if line.startswith("python -m ablate.tune ") else "readme"


DOCS = [REPO / "README.md", REPO / "docs" / "tune.md", REPO / "docs" / "baseline.md", REPO / "sweeps" / "README.md"]
SHORT = ["train.steps=8", "train.warmup_steps=2", "train.log_every=4", "metrics.gemm_probe_n=256"]
TRAINS = ("ablate", "ablate.sweeps", "ablate.tune")     # entry points that train, so take SHORT
# what libraries print on their own (torch's deprecations under DeepSpeed, DeepSpeed's op builds and
# compiler probes, Kineto's USDT lines, W&B's banner): the run's log file, never the terminal
LIBRARY_NOISE = re.compile(r"FutureWarning|DeprecationWarning|^USDT:|\bgcc |built successfully|^wandb: ", re.M)


def blocks(text: str) -> List[Tuple[str, List[str]]]:
    """(language, lines) of every fenced block."""
    return [(m.group(1), m.group(2).splitlines()) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]


def commands() -> List[Tuple[str, str, Optional[str]]]:
    """(source, command line, expected output or None), deduplicated, in document order."""
    out, seen = [], set()
    for doc in DOCS:
        for lang, lines in blocks(doc.read_text()):
            if lang == "bash":   # a line continued with a backslash is one command; comments dropped
                logical = "\n".join(lines).replace("\\\n", " ").splitlines()
                found = [(cmd, None) for cmd in (shlex.join(shlex.split(ln, comments=True)) for ln in logical) if cmd]
            elif lang == "console":
                found = [(lines[i][2:].split("  #")[0].strip(), lines[i + 1].strip())
                         for i in range(len(lines) - 1) if lines[i].startswith("$ ")]
            else:
                continue
            for line, expected in found:
                if line.startswith("make ") or line in seen:
                    continue
                seen.add(line)
                out.append((doc.relative_to(REPO).as_posix(), line, expected))
    return out


def shortened(argv: List[str]) -> List[str]:
    """The user's command with a few training steps appended (never anything edited)."""
    module = argv[2] if argv[:2] == ["python", "-m"] else ("ablate" if argv[0] == "ablate" else None)
    if module not in TRAINS or "--list" in argv:
        return argv
    if module == "ablate.sweeps" and "--" not in argv:
        return [*argv, "--", *SHORT]
    return [*argv, *SHORT]


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """A user's shell: a working directory outside the checkout, only PATH (with the installed python
    first) and HOME; measured peaks go to a cache of the test run's own, never the user's. In the parallel
    tier (3 workers on 2 cores) its commands take one OpenMP thread a process, as every other command the
    suite starts there (conftest.py): with torch's default beside two busy workers a run spins threads on
    cores it does not get. A bare shell's default (cores shared by the ranks, train/ranks.py) is what the
    serial tier's runs and `make run` use."""
    workdir = tmp_path_factory.mktemp("user")
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": os.environ["HOME"],
           "ABLATE_CACHE_DIR": os.environ["ABLATE_CACHE_DIR"]}
    if os.environ.get("PYTEST_XDIST_WORKER"):
        env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    return workdir, env


TYPED: Dict[str, subprocess.CompletedProcess] = {}   # what each command printed, for the tests that read its results


def type_command(line: str, expected: Optional[str], user) -> subprocess.CompletedProcess:
    workdir, env = user
    argv = shortened(shlex.split(line)) if expected is None else shlex.split(line)
    TYPED[line] = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    return TYPED[line]


def run_dirs(stderr: str) -> List[Path]:
    return [Path(m) for m in re.findall(r"^run dir: (.+)$", stderr, re.M)]


def test_the_docs_have_commands():
    found = commands()
    lines = [c[1] for c in found]
    assert "python -m ablate precision=bf16 parallel=zero3" in lines and C3_SWEEP in lines
    assert "python -m ablate -m precision=fp32,bf16 parallel=ddp,zero3 launcher.nproc_per_node=2" in lines
    assert sum(c[2] is not None for c in found) >= 3


@pytest.mark.parametrize("source,line,expected", [pytest.param(*c, marks=pytest.mark.xdist_group(chain_of(c[1])))
                                                  for c in commands()],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_documented_command_runs_as_typed(source, line, expected, user):
    before = set(user[0].rglob("*"))
    done = type_command(line, expected, user)
    shown = f"{source}: `{line}` exited {done.returncode}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, shown
    if expected is not None:            # a documented refusal: that one line, exit 2, nothing made
        assert done.returncode == 2, shown
        assert done.stderr.strip() == expected, shown
        assert set(user[0].rglob("*")) == before, "a refused command left files behind"
        return
    assert done.returncode == 0, shown
    assert not LIBRARY_NOISE.search(done.stdout + done.stderr), shown    # it went to <run dir>/ablate.log
    for run_dir in run_dirs(done.stderr):    # every run it reports has its record
        assert (run_dir / "summary.json").exists(), shown
    if line.startswith("python -m ablate -m "):
        assert len(run_dirs(done.stderr)) == 4, shown
    if line.startswith("python -m ablate.tune ") and "--confirm 3" in line:   # the suite's one confirmed tune
        out = user[0] / line.split("--dir ")[1].split()[0]
        assert "**Confirmed** (3 more runs each): " in (out / "report.md").read_text()   # its verdict: the host's
        assert len(list(out.glob("confirm/*/summary.json"))) == 6
    if line.startswith("python -m ablate.sweeps layouts "):   # one comparison per treatment, the layout column
        report = (user[0] / "sweeps_out" / "layouts" / "report.md").read_text()
        assert "layouts_hsdp" in report and "layouts_fsdp2_tp2" in report and "1x1x4x1 -> 1x2x2x1" in report, report
    if line == "python -m ablate precision=bf16 parallel=zero3":
        summary = json.loads((run_dirs(done.stderr)[0] / "summary.json").read_text())
        assert summary["numerics"]["compute_dtype"] == "bfloat16" and summary["per_rank"][0]["rank"] == 0
        assert str(user[0]) in summary["run_dir"]          # written under the user's directory


def test_the_documented_grid_reported_gives_every_exact_figure_and_each_cell(user):
    """The README's 2x2 grid, typed above in this user directory (a real -m grid: 4 jobs of 2 ranks), then
    `ablate.report` on it, in process (~2 s): the exact comm effect of `parallel` in effects.csv, a point
    estimate for speed at one run per cell, every cell's figures and the effects plot. (The one real -m grid
    that is reported end to end; intervals from repeats are checked on planted runs, test_effects.py.)"""
    from ablate import report

    grids = {p.parent.parent for p in user[0].glob("multirun/*/*/*/summary.json")
             if json.loads(p.read_text())["choices"].get("parallel") == "zero3"}
    assert len(grids) == 1, f"the README's grid was not found under {user[0]}/multirun: {grids}"
    (grid,) = grids
    assert report.main([str(grid)]) == 0
    rows = {(r["metric"], r["term"]): r for r in csv.DictReader((grid / "effects.csv").open())}
    comm = rows[("comm_bytes_per_step", "parallel")]
    assert comm["exact"] == "True" and float(comm["estimate"]) > 1       # zero3 moves more bytes than ddp
    assert rows[("tokens_per_s", "precision")]["ci_low"] == ""            # n = 1 a cell: no interval
    md = (grid / "report.md").read_text()
    assert "Each cell (the central value of its runs):" in md and md.count("| 1 | ") == 4
    assert list(grid.glob("*.effects.png"))
    # one runtime: a single run (the README's first command) and a -m job record the same keys
    (single,) = run_dirs(TYPED["python -m ablate"].stderr)
    cell = json.loads(next(grid.glob("*/summary.json")).read_text())
    assert set(json.loads((user[0] / single / "summary.json").read_text())) == set(cell)


C3_SWEEP = "python -m ablate.sweeps c3_no_sync --repeats auto --max-repeats 3 --dir sweeps_out/c3 -- logger=none"


@pytest.mark.xdist_group("readme_c3")   # reads what the c3 sweep typed above made, on its worker
def test_the_documented_sweep_repeats_until_decided_with_intervals_and_exact_comm(user):
    """The README's c3 sweep, typed above (2-rank runs, 4 or 6 of them), read here in process: interleaved
    repeats, one shared peak, the exact eighth of the bytes and of the calls in every pair (one all-reduce of
    each gradient per optimizer step), intervals, and repeats that stopped by themselves and say why
    (report/sequential.py); each run's trace drawn as a timeline. (It was a sweep of its own in
    test_report.py, ~100 s of CI for the same runs; test_parallel.py's no_sync test, two more runs of exactly
    this pair, ~50 s.)"""
    sweep, typed = user[0] / "sweeps_out" / "c3", TYPED.get(C3_SWEEP)
    assert typed is not None and typed.returncode == 0, f"`{C3_SWEEP}` did not run above (README.md changed?)"
    assert "report: sweeps_out/c3/report.md" in typed.stdout and "look at n=2: " in typed.stdout   # as typed: relative
    record = json.loads((sweep / "sequential.json").read_text())
    assert record["looks"][0] == 2 and record["level"] == pytest.approx(1 - 0.05 / 2)
    assert record["stopped"].startswith(("every verdict decided at n=", "max repeats reached (n=3)"))
    assert "**Repeats: auto** — " + record["stopped"] in (sweep / "report.md").read_text()
    summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("c3_no_sync/*/summary.json"))
                 if not p.parent.name.endswith("_rerun")]   # an outlier run once more beside it (a busy host)
    repeats = len(summaries) // 2
    assert repeats in (2, 3) and [s["sweep"]["repeat"] for s in summaries] == [r for r in range(repeats)
                                                                              for _ in (0, 1)]   # A B A B
    rows = {r["metric"]: r for r in csv.DictReader((sweep / "report.csv").open())}
    comm = rows["comm_bytes_per_step"]
    assert comm["n"] == str(repeats) and comm["exact"] == "True" and float(comm["measured"]) == pytest.approx(0.875)
    assert comm["verdict"] == "reproduced"
    for synced, deferred in zip(summaries[0::2], summaries[1::2]):   # each repeat's pair: exactly an eighth
        assert (synced["choices"]["parallel"], deferred["choices"]["parallel"]) == ("ddp_sync", "ddp")
        assert deferred["comm_bytes_per_step"] / synced["comm_bytes_per_step"] == 0.125
        assert deferred["comm_calls_per_step"] / synced["comm_calls_per_step"] == 0.125
        assert deferred["comm_bytes_per_step"] == deferred["state_bytes"]["grads"]   # every fp32 gradient, once
    speed = rows["tokens_per_s"]
    assert speed["effect_kind"] == "ratio"   # 8 steps, n=2 or 3: an interval, or why none is printed
    assert (speed["ci_low"] and speed["ci_high"]) or "too small for an interval" in speed["reason"], speed
    assert speed["verdict"] in ("reproduced", "not reproduced", "inconclusive")
    assert len({s["peak_flops_measured"] for s in summaries}) == 1            # one shared peak
    assert rows["comm_exposed_s"]["verdict"] == "no claim"                    # from each run's trace
    assert len(list(sweep.glob("c3_no_sync_*_rank*.timeline.png"))) == 4      # 2 arms x 2 ranks
