"""Factorial designs (pyDOE3) and their analysis (statsmodels): designs for 2^3 and 2^(5-1), planted main
effects and an interaction recovered, exact figures exact, and intervals calibrated over 200 datasets."""
import csv
import math
import random

import pytest

from ablate import design, report
from ablate.report import effects
from test_report import fake_run

FACTORS = {"precision": ["fp32", "bf16"], "parallel": ["ddp_sync", "ddp"], "dataloader": ["naive", "pinned"]}
SWEEP = {"name": "matrix", "claim": "matrix", "technique": "2^3", "design": "factorial", "factors": FACTORS,
         "responses": ["tokens_per_s", "comm_bytes_per_step", "data_wait_frac"]}
# planted truth: bf16 x1.5, ddp (no_sync) x2.0, pinned x1.1; ddp's gain is x1.2 larger under bf16 (ratio of ratios)
TRUTH = {"precision": 1.5, "parallel": 2.0, "dataloader": 1.1, "precision:parallel": 1.2}


def speed(cell, noise):
    """tokens/s of one run: log-linear in the coded factors, with the planted interaction."""
    x = {k: 1 if cell[k] == FACTORS[k][1] else -1 for k in FACTORS}
    log = math.log(1000) + sum(x[k] * math.log(TRUTH[k]) / 2 for k in FACTORS)
    log += x["precision"] * x["parallel"] * math.log(TRUTH["precision:parallel"]) / 4
    return math.exp(log + noise)


def planted(root, repeats=2, sd=0.02, seed=0):
    rng = random.Random(seed)
    for r in range(repeats):
        for i, cell in enumerate(design.build(FACTORS).points):
            config = {"precision": {"name": cell["precision"]}, "parallel": {"name": cell["parallel"]},
                      "dataloader": {"name": cell["dataloader"]}}
            fake_run(root, f"{r}_{i}", config, {**SWEEP, "repeat": r}, tokens_per_s=speed(cell, rng.gauss(0, sd)),
                     comm_bytes_per_step=800.0 if cell["parallel"] == "ddp_sync" else 100.0,
                     data_wait_frac=0.2 if cell["dataloader"] == "naive" else 0.01 + rng.gauss(0, 0.001))


def test_designs_come_from_pydoe3_with_resolution_and_aliases():
    full = design.build(FACTORS)
    assert len(full.points) == 8 and full.resolution is None and not full.aliases
    assert full.points[0] == {"precision": "fp32", "parallel": "ddp_sync", "dataloader": "naive"}
    half = design.build({k: [0, 1] for k in "pqrst"}, "a b c d abcd")      # 2^(5-1): the word abcde
    assert len(half.points) == 16 and half.resolution == 5 and "e = abcd" in half.aliases
    third = design.build({k: [0, 1] for k in "pqr"}, "a b ab")             # 2^(3-1): the word abc
    assert len(third.points) == 4 and third.resolution == 3 and "c = ab" in third.aliases
    with pytest.raises(ValueError, match="two or more factors"):
        design.build({"precision": ["fp32", "bf16"]})


def test_planted_effects_and_the_interaction_are_recovered(tmp_path):
    planted(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    rows = {(r["metric"], r["term"]): r for r in csv.DictReader((tmp_path / "effects.csv").open())}
    for term, truth in TRUTH.items():
        row = rows[("tokens_per_s", term)]
        assert float(row["ci_low"]) < truth < float(row["ci_high"]), (term, row)
        assert float(row["estimate"]) == pytest.approx(truth, rel=0.05)
    assert rows[("tokens_per_s", "precision:parallel")]["kind"] == "ratio of ratios"
    assert rows[("tokens_per_s", "precision:parallel:dataloader")]["n"] == "16"
    comm = rows[("comm_bytes_per_step", "parallel")]
    assert comm["exact"] == "True" and float(comm["estimate"]) == pytest.approx(0.125)
    assert float(rows[("comm_bytes_per_step", "precision")]["estimate"]) == pytest.approx(1.0)
    wait = rows[("data_wait_frac", "dataloader")]
    assert wait["kind"] == "difference" and float(wait["estimate"]) == pytest.approx(-0.19, abs=0.002)
    md = (tmp_path / "report.md").read_text()
    assert "| tokens_per_s | `precision:parallel` |" in md and "matrix.effects.png" in md
    assert (tmp_path / "matrix.effects.png").stat().st_size > 1000


def test_effect_intervals_are_calibrated_over_200_seeded_datasets(tmp_path):
    """The 95% intervals of the four planted terms cover the truth in 90-99% of 200 datasets."""
    covered = total = 0
    for seed in range(200):
        runs = []
        rng = random.Random(seed)
        for _repeat in range(2):
            for cell in design.build(FACTORS).points:
                config = {k: {"name": v} for k, v in cell.items()}
                runs.append(report.runs.Run(tmp_path, {"tokens_per_s": speed(cell, rng.gauss(0, 0.1))}, config))
        found = effects.analyse("matrix", {**SWEEP, "responses": ["tokens_per_s"]}, runs).effects
        for e in found:
            if e.term in TRUTH:
                total += 1
                covered += e.ci_low <= TRUTH[e.term] <= e.ci_high
    assert total == 800 and 0.90 <= covered / total <= 0.99, covered / total


def test_an_adhoc_grid_is_analysed_by_the_groups_the_user_varied(tmp_path):
    """A `-m precision=fp32,bf16 parallel=ddp_sync,ddp` grid: two factors (not every leaf key the
    groups touch), the first run's levels the reference, seeds as repeats."""
    for seed in (0, 1):
        for i, (prec, par) in enumerate([("fp32", "ddp_sync"), ("bf16", "ddp_sync"), ("fp32", "ddp"),
                                         ("bf16", "ddp")]):
            config = {"precision": {"name": prec, "init_scale": 1.0 if prec == "fp32" else 2.0},
                      "parallel": {"name": par, "no_sync": par == "ddp"}, "train": {"seed": seed}}
            cell = {"precision": prec, "parallel": par, "dataloader": "naive"}
            fake_run(tmp_path, f"{seed}_{i}", config, tokens_per_s=speed(cell, 0.01 * seed),
                     comm_bytes_per_step=800.0 if par == "ddp_sync" else 100.0)
    built = report.build([tmp_path])
    assert not built.groups and [f.name for f in built.found["factorials"]] == ["grid"]
    (grid,) = built.found["factorials"]
    assert grid.sweep["factors"] == {"parallel": ["ddp_sync", "ddp"], "precision": ["fp32", "bf16"]}
    terms = {(e.metric, e.term): e for e in grid.effects}
    assert terms[("comm_bytes_per_step", "parallel")].estimate == pytest.approx(0.125)
    assert ("tokens_per_s", "parallel:precision") in terms
    assert report.main([str(tmp_path)]) == 0 and (tmp_path / "effects.csv").exists()


def test_the_number_of_ranks_is_a_knob_not_the_hardware(tmp_path):
    fake_run(tmp_path, "one", {"launcher": {"nproc_per_node": 1}}, world_size=1, tokens_per_s=100.0)
    fake_run(tmp_path, "two", {"launcher": {"nproc_per_node": 2}}, world_size=2, tokens_per_s=180.0)
    speed_check = next(c for c in report.build([tmp_path]).checks if c.metric == "tokens_per_s")
    assert speed_check.verdict != "not measurable here" and speed_check.measured == pytest.approx(1.8)


def test_one_run_per_cell_gives_point_effects_exact_counts_and_every_cell(tmp_path):
    """A -m grid at n = 1 (the README's 2x2): every effect as a point estimate, a count's effect exact, and a
    table of every cell's figures; intervals come with repeats."""
    planted(tmp_path, repeats=1)
    assert report.main([str(tmp_path)]) == 0
    rows = {(r["metric"], r["term"]): r for r in csv.DictReader((tmp_path / "effects.csv").open())}
    comm = rows[("comm_bytes_per_step", "parallel")]
    assert comm["exact"] == "True" and float(comm["estimate"]) == pytest.approx(0.125) and comm["n"] == "8"
    speed_row = rows[("tokens_per_s", "precision")]
    assert speed_row["exact"] == "False" and speed_row["ci_low"] == ""
    md = (tmp_path / "report.md").read_text()
    assert "one run per cell: each effect is a point estimate without an interval" in md
    assert "Each cell (the central value of its runs):" in md and md.count("| 1 | ") == 8


def test_a_factorial_opens_with_its_conclusion_holm_corrected(tmp_path):
    planted(tmp_path)
    built = report.build([tmp_path])
    (factorial,) = built.found["factorials"]
    said = "\n".join(effects.conclusion(factorial))
    assert "the largest main effects: `parallel` x1.98 [x1.92, x2.04]; `precision` x1.52" in said   # planted 2, 1.5
    assert "Interactions distinguishable from noise: `precision:parallel` x1.24" in said   # planted 1.2
    p = {e.term: e.p_holm for e in factorial.effects if e.metric == "tokens_per_s"}
    assert p["precision:parallel"] < 0.05 and p["parallel:dataloader"] > 0.05   # planted 1.2 vs none


def test_holm_by_hand_and_as_statsmodels_has_it():
    from statsmodels.stats.multitest import multipletests

    p = [0.01, 0.04, 0.03, 0.20]
    # sorted 0.01, 0.03, 0.04, 0.20 times 4, 3, 2, 1 = 0.04, 0.09, 0.08 -> 0.09 (monotone), 0.20
    assert effects.holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.20])
    assert effects.holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))


def test_one_registry_of_figures_feeds_every_view():   # in process, ~0 s
    """A figure is declared once (units.FIGURES); the console, arm table, effects, cells and the gate read it:
    the same unit, scale and exactness everywhere (mfu_common_peak's effects are ratios, like its plots')."""
    from ablate import baseline, console, units
    from ablate.report import effects, output

    assert console.SUMMARY_ROWS == units.in_view("console") and output.ARM_COLUMNS == units.in_view("arm")
    assert effects.RESPONSES == units.in_view("effect") and effects.CELL_FIGURES == units.in_view("cell")
    assert set(baseline.TIMED) | set(baseline.EXACT) == set(units.in_view("gate"))
    assert baseline.TIMED["step_time_s"] == "lower" and "comm_calls_per_step" in baseline.EXACT
    assert units.on_log_scale("mfu_common_peak") and not units.on_log_scale("data_wait_frac")
    assert units.on_log_scale("tokens_per_s") and not units.on_log_scale("time/data_wait_frac")   # undeclared
    assert units.fmt("comm_calls_per_step", 9) == "9 calls/step" and units.fmt("mfu_common_peak", 0.25) == "25.0%"
    assert units.fmt("per_rank_bytes", 2e9) == "2.0 GB"                 # undeclared: by its name's kind
