"""The W&B view (#25): one group per call, the workspace of a sweep built as code (wandb-workspaces, read
back from its spec), and the verdicts as a `report` run written by the real wandb, offline."""
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ablate import report
from ablate.logger import run_identity
from conftest import cli_in_process
from test_report import SWEEP, c3_run

GROUP = "c3_no_sync-D"


def c3_runs_logged_to_wandb(root):
    for r, (b, t) in enumerate([(100.0, 150.0), (100.0, 160.0), (100.0, 140.0)]):
        for no_sync, nbytes, speed in ((False, 800.0, b), (True, 100.0, t)):
            run = c3_run(root, f"{r}_{no_sync}", no_sync, r, comm_bytes_per_step=nbytes, tokens_per_s=speed,
                         fragmentation=None, wandb={"group": GROUP, "mode": "offline", "id": f"x{r}{no_sync}"})
            config = (run / "config.yaml").read_text()
            (run / "config.yaml").write_text(config + "logger: {name: wandb, project: ablate-test, entity: null}\n")


def test_a_sweeps_workspace_is_built_as_code_and_its_verdicts_logged_as_a_report_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    c3_runs_logged_to_wandb(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    spec = json.loads((tmp_path / "wandb_workspace.json").read_text())
    assert spec["project"] == "ablate-test"
    view = spec["spec"]["section"]
    (section,) = view["panelBankConfig"]["sections"]
    assert section["name"].startswith("C3") and "c3_no_sync" in section["name"]
    bars = [p for p in section["panels"] if p["viewType"] == "Bar Chart"]
    assert [p["config"]["metrics"] for p in bars] == [[c["metric"]] for c in SWEEP["checks"]]
    assert all(p["config"]["groupArea"] == "stderr" and p["config"]["groupBy"] == "parallel.value.no_sync"
               for p in bars)
    lines = [p for p in section["panels"] if p["viewType"] == "Run History Line Plot"]
    assert [(p["config"]["xAxis"], p["config"]["metrics"]) for p in lines] == [("step", ["tokens_per_s"]),
                                                                                 ("step", ["loss"])]
    (runset,) = view["runSets"]
    assert runset["filters"]["filters"] == [{"key": {"section": "run", "name": "group"}, "op": "=", "value": GROUP,
                                             "disabled": False}]
    (table,) = tmp_path.glob("wandb/offline-run-*/files/media/table/verdicts_*.table.json")
    verdicts = json.loads(table.read_text())
    assert verdicts["columns"] == ["claim", "check", "claimed", "expected here", "measured", "interval", "n",
                                   "verdict"]
    assert ["C3", "reproduced"] == [verdicts["data"][0][0], verdicts["data"][0][-1]]
    assert len(verdicts["data"]) == 3
    assert not report.build([tmp_path]).unfinished        # the report run's files are not a run
    assert report.main([str(tmp_path), "--wandb"]) == 2       # offline: says what it needs, in one line
    assert len(list(tmp_path.glob("wandb/offline-run-*"))) == 1   # the folder's report run replaced, not added to
    assert spec["entity"] == "your-entity" and section["localPanelSettings"]["xAxis"] == "step"
    monkeypatch.setenv("WANDB_ENTITY", "my-team")
    assert report.main([str(tmp_path)]) == 0
    assert json.loads((tmp_path / "wandb_workspace.json").read_text())["entity"] == "my-team"
    assert report.main([str(tmp_path), "--entity", "other-team"]) == 0
    assert json.loads((tmp_path / "wandb_workspace.json").read_text())["entity"] == "other-team"


def test_runs_without_wandb_get_no_view_and_wandb_is_refused_in_one_line(tmp_path, capsys):
    c3_run(tmp_path, "a", False, 0, comm_bytes_per_step=800.0, tokens_per_s=1.0, fragmentation=None)
    c3_run(tmp_path, "b", True, 0, comm_bytes_per_step=100.0, tokens_per_s=1.0, fragmentation=None)
    assert report.main([str(tmp_path), "--wandb"]) == 2
    assert "none of these runs was logged to W&B" in capsys.readouterr().err
    assert not (tmp_path / "wandb_workspace.json").exists()


def test_a_sweeps_runs_are_tagged_with_its_name():
    ident = run_identity({"sweep": {**SWEEP, "repeat": 1}, "parallel": {"no_sync": True}}, None)
    assert ident["tags"] == ["sweep:c3_no_sync", "arm:treatment", "repeat:1"]


@pytest.mark.slow
def test_an_adhoc_multirun_groups_its_runs_by_call(tmp_path, capsys):
    """The -m call's main() in this process (conftest.cli_in_process), its 2 jobs processes with W&B offline."""
    from wandb_file import digest

    result = cli_in_process(capsys, ["-m", "precision=fp32,bf16", "train.steps=3", "train.warmup_steps=1",
                                     "metrics.gemm_probe_n=128",
                                     "metrics.predict=false", f"hydra.sweep.dir={tmp_path / 'call7'}"])
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted(tmp_path.glob("call7/*/wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 2
    assert {digest(f)["run"].run_group for f in files} == {"multirun-call7"}
    # the upload line `ablate.report --wandb` prints without credentials (its globs, as a shell expands them), as
    # wandb itself reads it: both runs, and the report's own run (in process, ~3 s)
    env = {k: os.environ.pop(k) for k in ("WANDB_API_KEY", "WANDB_MODE") if k in os.environ}
    try:
        assert report.main([str(tmp_path / "call7"), "--wandb"]) == 2
    finally:
        os.environ.update(env)
    said = capsys.readouterr().err.strip().splitlines()[-1]
    globs = said.split("(wandb sync ", 1)[1].split(")", 1)[0].split()
    found = sorted(p for g in globs for p in glob.glob(g))
    assert len(found) == 3 and sum("report-" in p for p in found) == 1, said
    wandb_cli = Path(sys.executable).parent / "wandb"
    dry = subprocess.run([str(wandb_cli), "sync", "--dry-run", *found], capture_output=True, text=True, timeout=120)
    assert "Would sync 3 run(s)" in dry.stdout + dry.stderr, dry.stdout + dry.stderr


def test_a_grid_over_two_knobs_gets_a_parallel_coordinates_panel(tmp_path, monkeypatch):
    from test_report import fake_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for precision in ("fp32", "bf16"):
        for par in ("ddp_sync", "ddp"):
            run = fake_run(tmp_path, f"{precision}_{par}", {"precision": {"name": precision}, "parallel": {"name": par},
                                                            "logger": {"project": "ablate-test"}},
                           tokens_per_s=1.0, wandb={"group": "multirun-g", "mode": "offline"})
            assert run.exists()
    assert report.main([str(tmp_path)]) == 0
    (section,) = json.loads((tmp_path / "wandb_workspace.json").read_text())["spec"]["section"]["panelBankConfig"][
        "sections"]
    assert "factorial" in section["name"]                   # a full 2x2 grid: analysed as a factorial
    (coords,) = [p for p in section["panels"] if p["viewType"] == "Parallel Coordinates Plot"]
    assert [c["accessor"] for c in coords["config"]["columns"]] == [
        "config:parallel.value.name", "config:precision.value.name", "summary:tokens_per_s"]
