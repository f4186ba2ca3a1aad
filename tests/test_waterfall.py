"""The stack as a waterfall: arms from design.stack, changes against the right reference, read back."""
import csv

import pytest
import yaml

from ablate import SWEEPS_DIR, design, report
from test_report import fake_run

NODE = yaml.safe_load((SWEEPS_DIR / "week4_stack.yaml").read_text())["sweep"]
GAIN = {"no_sync": 1.5, "bf16": 1.2, "expandable": 1.0, "pinned": 1.3}   # planted, multiplicative


def test_the_stack_arms_are_cumulative_then_memory_then_leave_one_out():
    arms = design.stack(NODE)
    assert [a.label for a in arms] == ["baseline", "plus_no_sync", "plus_bf16", "plus_expandable", "plus_pinned",
                                       "full_zero3", "minus_no_sync", "minus_bf16", "minus_expandable",
                                       "minus_pinned"]
    minus_bf16 = next(a for a in arms if a.label == "minus_bf16")
    assert "precision=fp32" in minus_bf16.overrides and "parallel=ddp" in minus_bf16.overrides


def test_a_planted_stack_gives_each_steps_change_with_an_interval(tmp_path):
    for r, noise in enumerate((1.0, 1.01, 0.99)):
        for arm in design.stack(NODE):
            on = {s["name"] for s in NODE["steps"]}
            if arm.kind == "cumulative":
                names = [s["name"] for s in NODE["steps"]]
                on = set(names[:names.index(arm.step) + 1]) if arm.step != "baseline" else set()
            elif arm.kind == "leave_one_out":
                on.discard(arm.step)
            speed = 1000.0 * noise
            for step in on:
                speed *= GAIN[step]
            node = {**NODE, "repeat": r, "arm": arm.label}
            fake_run(tmp_path, f"{r}_{arm.label}", {"sweep": {"arm": arm.label}}, node,
                     tokens_per_s=speed, tokens_per_s_per_device=speed / 2, flops_per_token=1e6, peak_flops=1e10,
                     mem_peak_bytes=1e9 / (4 if arm.kind == "memory" else 1))
    assert report.main([str(tmp_path)]) == 0
    rows = {(r["kind"], r["step"], r["metric"]): r for r in csv.DictReader((tmp_path / "waterfall.csv").open())}
    for step, gain in GAIN.items():
        cumulative = rows[("cumulative", step, "tokens_per_s")]
        assert float(cumulative["change"]) == pytest.approx(gain, rel=1e-6)
        assert float(cumulative["change_ci_low"]) <= gain <= float(cumulative["change_ci_high"])
        left_out = rows[("leave_one_out", step, "tokens_per_s")]
        assert float(left_out["change"]) == pytest.approx(1 / gain, rel=1e-6)
    assert float(rows[("memory", "zero3", "mem_peak_bytes")]["change"]) == pytest.approx(0.25)
    assert float(rows[("cumulative", "baseline", "mfu_common_peak")]["value"]) == pytest.approx(0.05)
    assert (tmp_path / "week4_stack.waterfall.png").stat().st_size > 1000
    assert "waterfall" in (tmp_path / "report.md").read_text()
