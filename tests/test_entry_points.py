"""Every entry point as hard as the first: a table of bad inputs (command, what its one line says), each typed into
the entry point's main() in this process (< 1 s each): exit 2, one `error:` line after argparse's usage (or alone),
no traceback, nothing written to the working directory or to --dir. A new flag gets its row here."""
from __future__ import annotations

import pytest

from ablate.baseline.__main__ import main as baseline_main
from ablate.check.__main__ import main as check_main
from ablate.maxbatch import main as maxbatch_main
from ablate.plan import main as plan_main
from ablate.report import plan
from ablate.report.cli import main as report_main
from ablate.sweeps.__main__ import main as sweeps_main
from ablate.tune.__main__ import main as tune_main

MAINS = {"ablate.sweeps": sweeps_main, "ablate.report": report_main, "ablate.plan": plan_main,
         "ablate.maxbatch": maxbatch_main, "ablate.tune": tune_main, "ablate.baseline": baseline_main,
         "ablate.check": check_main}
LONG = "x" * 300
BAD = [
    ("ablate.sweeps", ["c3_no_sync", "--dir", ""], "argument --dir: an empty path"),
    ("ablate.sweeps", ["c3_no_sync", "--dir", f"out/{LONG}"], "a name of 300 bytes"),
    ("ablate.sweeps", ["c3_no_sync", "--run-timeout", "nan"], "argument --run-timeout: nan: not a finite number"),
    ("ablate.sweeps", ["c3_no_sync", "--min-repeats", "0"], "argument --min-repeats: 0: out of range"),
    ("ablate.sweeps", ["c3_no_sync", "--config-dir", "/nonexistent"], "argument --config-dir: '/nonexistent': no such"),
    ("ablate.sweeps", ["c3_no_sync", "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    ("ablate.sweeps", ["no_such_sweep"], "no_such_sweep"),
    ("ablate.sweeps", ["c5_expandable", "--batch-search", "foo=1"], "--batch-search.foo: no such key; valid keys:"),
    ("ablate.sweeps", ["c5_expandable", "--batch-search", "limit=-4"], "--batch-search.limit=-4: out of range"),
    ("ablate.report", [f"/tmp/{LONG}"], "a name of 300 bytes; no folder has one"),
    ("ablate.maxbatch", ["--start", "64", "--limit", "8"], "--start=64: above --limit=8; nothing to search"),
    ("ablate.report", ["/nonexistent"], "argument dirs: '/nonexistent': no such folder"),
    ("ablate.report", [".", "--confidence", "1.5"], "argument --confidence: 1.5: out of range"),
    ("ablate.report", [".", "--out", ""], "argument --out: an empty path"),
    ("ablate.plan", ["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    ("ablate.plan", ["--config-dir", "/nonexistent"], "argument --config-dir: '/nonexistent': no such folder"),
    ("ablate.plan", ["precision=fp12"], "precision=fp12: no such choice"),
    ("ablate.maxbatch", ["--mem-budget-gb", "nan"], "argument --mem-budget-gb: nan: not a finite number"),
    ("ablate.maxbatch", ["--mem-budget-gb", "-1"], "argument --mem-budget-gb: -1: out of range"),
    ("ablate.maxbatch", ["--mem-budget-gb", "0"], "argument --mem-budget-gb: 0: out of range"),
    ("ablate.maxbatch", ["--steps", "zero"], "argument --steps: 'zero': not an integer"),
    ("ablate.maxbatch", ["--config-dir", "/nonexistent"], "argument --config-dir: '/nonexistent': no such folder"),
    ("ablate.tune", ["--space", "optim=adamw,sgd", "--dir", ""], "argument --dir: an empty path"),
    ("ablate.tune", ["--space", "optim=adamw,sgd", "--dir", "t", "--trials", "0"], "argument --trials: 0: out of"),
    ("ablate.tune", ["--space", "optim=adamw,sgd", "--dir", "t", "--mem-budget-gb", "inf"], "not a finite number"),
    ("ablate.tune", ["--space", "optim=adamw,sgd", "--dir", "t", "--trial-timeout", "-5"], "--trial-timeout: -5"),
    ("ablate.tune", ["--space", "optim=adamw,sgd", "--dir", "t", "--bogus"], "unrecognized arguments: --bogus"),
    ("ablate.check", ["--steps", "0"], "argument --steps: 0: out of range"),
    ("ablate.check", ["--rtol", "2"], "argument --rtol: 2: out of range"),
    ("ablate.check", ["--config-dir", "/nonexistent"], "argument --config-dir: '/nonexistent': no such folder"),
    ("ablate.check", ["parallel=bogus"], "parallel=bogus: no such choice"),
    ("ablate.check", ["parallel=ddp", "--steps", "2", "train.seq_len=0"], "train.seq_len=0: out of range"),
    ("ablate.check", ["parallel=fsdp2", "parallel.tp=3", "launcher.nproc_per_node=4"], "parallel.tp=3: does not"),
    ("ablate.baseline", ["save", "/nonexistent", "--name", "a"], "argument dir: '/nonexistent': no such folder"),
    ("ablate.baseline", ["save", ".", "--name", LONG], "a name of 1 to 100 characters"),
    ("ablate.baseline", ["show", "a/b"], "a name of 1 to 100 characters without '/'"),
    ("ablate.baseline", ["check", ".", "--against", "a", "--threshold", "150%"], "--threshold 150%: out of range"),
]


@pytest.mark.parametrize("module, args, message", BAD, ids=[f"{m} {' '.join(a)[:40]}" for m, a, _ in BAD])
def test_a_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys, module, args, message):
    monkeypatch.chdir(tmp_path)
    try:
        code = MAINS[module](args)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith((" ", "usage:"))]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and message in lines[0], err
    assert list(tmp_path.iterdir()) == [], "a refused command wrote into the working directory"


def test_a_half_finished_sweeps_report_lists_what_is_missing(tmp_path):
    import json

    (tmp_path / "plan.json").write_text(json.dumps([{"sweep": "c3", "overrides": ["parallel=ddp"], "repeat": 0},
                                                    {"sweep": "c3", "overrides": ["parallel=ddp_sync"], "repeat": 0}]))
    done = plan.run_dir_of(tmp_path, 1, "c3", 0, "parallel=ddp")
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    assert plan.missing([tmp_path]) == ["c3 #2, repeat 0: parallel=ddp_sync"]


@pytest.mark.slow
def test_a_second_tune_into_the_same_dir_is_refused_and_the_first_completes(tmp_path, capsys):
    """Two `ablate.tune --trials 3` into one --dir at once (the first a process, ~20 s; the second in this process
    while the first holds the folder): exit codes 0 and 2, and 3 complete trials in tune.csv."""
    import subprocess
    import sys
    import time

    from conftest import COMMAND_ENV, REPO

    d = tmp_path / "tune"
    args = ["--space", "train.batch_size=4,8,16", "--trials", "3", "--dir", str(d), "--", "logger=none",
            "train.steps=6", "train.warmup_steps=2", "metrics.gemm_probe_n=64", "metrics.predict=false"]
    first = subprocess.Popen([sys.executable, "-m", "ablate.tune", *args], cwd=REPO,
                             env={**__import__("os").environ, **COMMAND_ENV}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (d / "optuna.db").exists():
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.1)
    capsys.readouterr()
    assert tune_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another ablate.tune call is running this tune" in err[0], err
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    rows = (d / "tune.csv").read_text().strip().splitlines()[1:]
    assert len(rows) == 3 and all(",complete," in r for r in rows), rows
