"""The regression gate (ablate.baseline): its interval and verdict rules by hand, its false-alarm rate and
power measured on seeded synthetic data, and the command line on planted runs (in process, ~2 s)."""
import json
import math
import random

import pytest

from ablate.baseline import check as C
from ablate.baseline.__main__ import main
from test_report import CPU, c3_run

GPU = {**CPU, "cpu_model": "another CPU", "cpu_cores": 64}


def test_welch_ratio_by_hand():
    ratio, low, high = C.welch_ratio([100, 100 * math.e ** 0.02, 100 * math.e ** -0.02], [90] * 2 + [90.0])
    assert ratio == pytest.approx(0.9)
    # logs: before sd 0.02 over 3 runs, after sd 0; se = 0.02/sqrt(3); Welch df = 2; t(0.975, 2) = 4.303
    half = 4.302653 * 0.02 / math.sqrt(3)
    assert low == pytest.approx(0.9 * math.exp(-half), rel=1e-5) and high == pytest.approx(0.9 * math.exp(half),
                                                                                             rel=1e-5)
    assert C.welch_ratio([100], [90, 91])[1:] == (None, None)


@pytest.mark.parametrize("better,low,high,expected", [
    ("higher", 0.80, 0.90, "regressed"), ("higher", 1.06, 1.20, "improved"), ("higher", 0.97, 1.04, "unchanged"),
    ("higher", 0.90, 1.02, "inconclusive"), ("lower", 1.06, 1.10, "regressed"), ("lower", 0.5, 0.9, "improved"),
    ("higher", None, None, "inconclusive")])
def test_verdicts_by_hand(better, low, high, expected):
    assert C.verdict(better, low, high, 0.05) == expected


def test_false_alarms_and_power_are_measured_on_seeded_data():
    """A/A at n = 3 a side with 3% noise (this host's quiet floor): at most 5% of 2,000 checks flag a regression
    at the default 5% threshold; a planted 20% slowdown is caught in at least 90%."""
    rng = random.Random(0)

    def runs(n, level):
        return [{"tokens_per_s": level * math.exp(rng.gauss(0, 0.03))} for _ in range(n)]

    def flagged(slowdown):
        row = C.compare({"arm": {"runs": runs(3, 1000.0)}}, {"arm": {"runs": runs(3, 1000.0 * (1 - slowdown))}},
                        metrics=["tokens_per_s"])[0]
        return row.verdict == "regressed"
    false_alarms = sum(flagged(0.0) for _ in range(2000)) / 2000
    power = sum(flagged(0.2) for _ in range(2000)) / 2000
    assert false_alarms <= 0.05 and power >= 0.90, (false_alarms, power)


def sweep(root, speed, comm=800.0, provenance=CPU):
    for r in range(3):
        for no_sync, factor in ((False, 1.0), (True, 1.4)):
            c3_run(root, f"{r}_{no_sync}", no_sync, r, tokens_per_s=speed * factor * (1 + 0.01 * (r - 1)),
                   step_time_s=1 / (speed * factor), comm_bytes_per_step=comm / (8 if no_sync else 1),
                   comm_calls_per_step=4.0, flops_per_token=1e6, mem_peak_bytes=1e8, mfu=0.3,
                   provenance=provenance)
    return root


def test_the_gate_passes_a_repeat_and_fails_a_regression(tmp_path, monkeypatch):
    store = str(tmp_path / "store")
    assert main(["save", str(sweep(tmp_path / "A", 1000.0)), "--name", "main", "--store", store]) == 0
    assert main(["check", str(sweep(tmp_path / "B", 1002.0)), "--against", "main", "--store", store]) == 0
    summary = tmp_path / "gh_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    slow = sweep(tmp_path / "C", 700.0)
    assert main(["check", str(slow), "--against", "main", "--store", store]) == 1
    rows = json.loads((slow / "check.json").read_text())["rows"]
    speed = next(r for r in rows if r["metric"] == "tokens_per_s" and r["arm"].endswith("=True"))
    assert speed["verdict"] == "regressed" and speed["change"] == pytest.approx(0.7, rel=0.01)
    assert "**regressed**" in (slow / "check.md").read_text() and "**regressed**" in summary.read_text()
    for comm, said in ((900.0, "lower is better, so a regression"), (600.0, "lower is better, so an improvement")):
        moved = sweep(tmp_path / f"D{comm:g}", 1000.0, comm=comm)   # (the baseline's: 800)
        assert main(["check", str(moved), "--against", "main", "--store", store, "--metrics",
                     "comm_bytes_per_step"]) == 1   # a count: any change is flagged, saying which way and if better
        counted = json.loads((moved / "check.json").read_text())["rows"]
        assert {r["verdict"] for r in counted} == {"changed"} and all(said in r["reason"] for r in counted), counted


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    store = str(tmp_path / "store")
    main(["save", str(sweep(tmp_path / "A", 1000.0)), "--name", "main", "--store", store])
    other = sweep(tmp_path / "B", 1000.0, provenance=GPU)
    cases = [(["check", str(other), "--against", "main", "--store", store], "do not compare across hardware"),
             (["check", str(tmp_path / "A"), "--against", "nope", "--store", store],
              "--against nope: no such baseline in"),
             (["check", str(tmp_path / "A"), "--against", "main", "--store", store, "--threshold", "150%"],
              "--threshold 150%: out of range"),
             (["save", str(tmp_path / "empty"), "--name", "x", "--store", store], "no such folder")]
    for argv, needle in cases:
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as e:   # argparse's refusal: its usage line, then one error line
            code = e.code
        assert code == 2, argv
        err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith(("usage:", " "))]
        assert len(err) == 1 and needle in err[0], err
    assert main(["check", str(other), "--against", "main", "--store", store, "--allow-other-hardware"]) == 0
