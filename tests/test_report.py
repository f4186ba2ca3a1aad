"""The report: pairing baseline/treatment runs, effects and verdicts (hand-made summaries), and a real
2-point sweep end to end into report.md / report.csv / PNG."""
import csv
import json
from pathlib import Path

import pytest
import yaml

from ablate import report
from conftest import run_cli

SWEEP = {"name": "c3_no_sync", "claim": "C3", "technique": "DDP deferred reduction", "knob": "parallel.no_sync",
         "baseline": False, "treatment": True, "claimed_text": "87.5% less traffic",
         "checks": [{"metric": "comm_bytes_per_step", "effect": "reduction", "claimed": 0.875, "tolerance": 0.001},
                    {"metric": "tokens_per_s", "effect": "ratio", "claimed": 2.2, "tolerance": 0.15},
                    {"metric": "fragmentation", "effect": "value_treatment", "claimed": 0.021, "gpu_only": True}]}


def fake_run(root: Path, name: str, no_sync: bool, **summary) -> Path:
    d = root / name
    d.mkdir(parents=True)
    base = {"sweep": SWEEP, "device": "cpu", "device_name": "cpu", "world_size": 2,
            "notes": {"fragmentation": "no CUDA device"}}
    (d / "summary.json").write_text(json.dumps({**base, **summary}))
    (d / "config.yaml").write_text(yaml.safe_dump({"parallel": {"name": "ddp", "no_sync": no_sync}}))
    return d


def test_pairing_effects_and_verdicts(tmp_path):
    fake_run(tmp_path, "0_sync", False, comm_bytes_per_step=800.0, tokens_per_s=100.0, fragmentation=None)
    fake_run(tmp_path, "1_nosync", True, comm_bytes_per_step=100.0, tokens_per_s=150.0, fragmentation=None)
    built = report.build([tmp_path])
    arms = built["sweeps"]["c3_no_sync"]["arms"]
    assert arms["baseline"].path.name == "0_sync" and arms["treatment"].path.name == "1_nosync"
    by_metric = {c.metric: c for c in built["checks"]}
    assert by_metric["comm_bytes_per_step"].measured == pytest.approx(0.875)
    assert by_metric["comm_bytes_per_step"].verdict == "reproduced"
    assert by_metric["tokens_per_s"].measured == pytest.approx(1.5)
    assert by_metric["tokens_per_s"].verdict == "not reproduced"
    assert by_metric["fragmentation"].verdict == "not measurable here"
    assert "no CUDA device" in by_metric["fragmentation"].reason


def test_verdict_directions():
    assert report.verdict({"effect": "ratio"}, 2.2, 3.0) == "reproduced"          # better than claimed
    assert report.verdict({"effect": "ratio", "tolerance": 0.1}, 2.2, 2.15) == "reproduced"   # absolute tolerance
    assert report.verdict({"effect": "ratio", "tolerance": 0.1}, 2.2, 2.05) == "not reproduced"
    assert report.verdict({"effect": "value_treatment", "better": "lower", "tolerance": 0.0}, 0, 1) == "not reproduced"
    assert report.verdict({"effect": "value_treatment", "better": "lower", "tolerance": 0.0}, 0, 0) == "reproduced"
    assert report.effect("reduction", 8.0, 1.0) == pytest.approx(0.875)
    assert report.effect("reduction", None, 1.0) is None


def test_partition_claims_are_scaled_to_the_world_size(tmp_path):
    sweep = {**SWEEP, "knob": "parallel.name", "baseline": "ddp", "treatment": "zero3",
             "checks": [{"metric": "state_bytes_total", "effect": "reduction", "claimed": 0.984, "scale": "partition"}]}
    for name, par, total in (("a", "ddp", 1600), ("b", "zero3", 800)):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"sweep": sweep, "world_size": 2, "per_rank": [
            {"state_bytes": {"params": total // 4, "grads": total // 4, "optimizer": total // 2}}]}))
        (d / "config.yaml").write_text(yaml.safe_dump({"parallel": {"name": par}}))
    (c,) = report.build([tmp_path])["checks"]
    assert c.expected_here == 0.5 and c.measured == pytest.approx(0.5) and c.verdict == "reproduced"


def test_report_of_nothing_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no runs of a sweeps/ file" in capsys.readouterr().err


@pytest.mark.slow
def test_a_real_two_point_sweep_ends_in_a_report(tmp_path):
    result = run_cli(["+sweeps=c3_no_sync", "logger=none", "train.steps=5", "train.warmup_steps=2",
                      "metrics.gemm_probe_n=128", f"hydra.sweep.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list(tmp_path.glob("*/summary.json"))) == 2
    assert report.main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "| C3 | comm_bytes_per_step" in md and "0.875 | — | 0.875 | **reproduced**" in md
    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert {r["metric"] for r in rows} >= {"comm_bytes_per_step", "tokens_per_s"}
    assert (tmp_path / "c3_no_sync.png").stat().st_size > 1000
