"""The statistics behind every verdict, on hand-worked numbers (t quantile for 2 d.f.: 4.302653)."""
import math

import pytest

from ablate.report import stats

T2 = 4.302653   # Student t, 97.5% quantile, 2 degrees of freedom


def ratios(*logs):
    """Baseline 100 each; treatments whose log-ratios are `logs`."""
    return [100.0] * len(logs), [100.0 * math.exp(x) for x in logs]


def test_t_quantile_is_students():
    assert stats.t_quantile(3) == pytest.approx(T2, rel=1e-6)


def test_an_interval_that_straddles_the_threshold_is_inconclusive():
    # log-ratios 0.6, 0.7, 0.8: mean 0.7, sd 0.1, half-width 4.302653 * 0.1 / sqrt(3) = 0.248414
    est = stats.estimate("ratio", *ratios(0.6, 0.7, 0.8))
    assert est.median == pytest.approx(math.exp(0.7))
    assert est.ci_low == pytest.approx(math.exp(0.7 - 0.248414), rel=1e-5)    # 1.5708
    assert est.ci_high == pytest.approx(math.exp(0.7 + 0.248414), rel=1e-5)   # 2.5816
    assert est.n == 3 and not est.exact
    # C3's x2.2 with tolerance 0.15: threshold 2.05 lies inside [1.57, 2.58]
    assert stats.verdict(2.2, 0.15, "higher", est) == "inconclusive"


def test_intervals_wholly_on_one_side():
    above = stats.estimate("ratio", *ratios(0.9, 0.95, 1.0))    # [exp(0.8258), exp(1.0742)] = [2.28, 2.93]
    assert above.ci_low == pytest.approx(2.2836, rel=1e-4)
    assert stats.verdict(2.2, 0.15, "higher", above) == "reproduced"
    below = stats.estimate("ratio", *ratios(0.1, 0.15, 0.2))    # [0.976, 1.316]
    assert below.ci_high == pytest.approx(1.3155, rel=1e-4)
    assert stats.verdict(2.2, 0.15, "higher", below) == "not reproduced"


def test_a_reduction_is_one_minus_the_ratio_interval():
    # treatment / baseline = exp(-0.6), exp(-0.7), exp(-0.8): reduction 1 - ratio
    est = stats.estimate("reduction", *ratios(-0.6, -0.7, -0.8))
    assert est.median == pytest.approx(1 - math.exp(-0.7))
    assert est.ci_low == pytest.approx(1 - math.exp(-0.7 + 0.248414), rel=1e-5)
    assert est.ci_high == pytest.approx(1 - math.exp(-0.7 - 0.248414), rel=1e-5)


def test_exact_counts_need_no_interval():
    est = stats.estimate("reduction", [800, 800, 800], [100, 100, 100], exact=True)
    assert est.exact and est.ci_low == est.ci_high == pytest.approx(0.875)
    assert stats.verdict(0.875, 0.001, "equal", est) == "reproduced"
    assert stats.verdict(0.984, 0.001, "equal", est) == "not reproduced"
    varied = stats.estimate("reduction", [800, 800, 800], [100, 120, 110], exact=True)
    assert not varied.exact and varied.ci_low is not None       # said, and given an interval instead


def test_levels_and_differences_use_plain_t_intervals():
    # data wait 0.02, 0.04, 0.06: mean 0.04, sd 0.02, half-width 4.302653 * 0.02 / sqrt(3) = 0.049683
    est = stats.estimate("value_treatment", [0, 0, 0], [0.02, 0.04, 0.06])
    assert (est.ci_low, est.ci_high) == pytest.approx((0.04 - 0.049683, 0.04 + 0.049683), rel=1e-4)
    assert stats.verdict(0.0, 0.05, "lower", est) == "inconclusive"     # 0.0897 > 0.05
    diff = stats.estimate("difference", [0.1, 0.1], [0.3, 0.5])
    assert diff.median == pytest.approx(0.3)


def test_one_run_per_arm_is_inconclusive_and_no_claim_says_no_change():
    one = stats.estimate("ratio", [100.0], [300.0])
    assert one.ci_low is None and stats.verdict(2.2, 0.15, "higher", one) == "inconclusive"
    aa = stats.estimate("ratio", *ratios(-0.1, 0.05, 0.1))
    assert stats.verdict(None, 0.05, "higher", aa) == "no claim" and aa.holds_no_change is True
    assert stats.estimate("ratio", [0.0], [1.0]) is None          # no ratio to a zero baseline


def test_a_ratio_interval_wider_than_the_span_is_not_printed_and_says_what_would_do():
    # log-ratios -2, 2: mean 0, sd 2.828; t(1 d.f.) 12.706 * 2.828 / sqrt(2) = 25.4 -> [x1e-11, x1e11]
    est = stats.estimate("ratio", *ratios(-2.0, 2.0))
    assert est.too_wide and est.ci_low is None and est.ci_high is None
    assert stats.verdict(1.0, 0.05, "higher", est) == "inconclusive"
    # sd 2.828 on the log scale: t(n) * 2.828 / sqrt(n) <= log(1.1) = 0.0953 needs n of about 3,470: > 1000
    assert est.repeats_needed is None and "over 1000 repeats" in stats.no_interval_text(est)
    # log-ratios -0.1, 0.1: sd 0.1414, half-width 12.706 * 0.1 = 1.27 -> [x0.28, x3.6]: span 12.7 > 4
    close = stats.estimate("ratio", *ratios(-0.1, 0.1))
    assert close.too_wide and close.repeats_needed == stats.repeats_needed(math.sqrt(0.02))
    assert "n=2 too small for an interval" in stats.no_interval_text(close)


def test_repeats_needed_is_the_first_n_whose_half_width_fits():
    # sd 0.1, target log(1.1) = 0.09531: n=6 gives 2.5706 * 0.1 / sqrt(6) = 0.1049 (too wide),
    # n=7 gives 2.4469 * 0.1 / sqrt(7) = 0.0925 (fits)
    assert stats.repeats_needed(0.1) == 7
    assert stats.repeats_needed(0.0) == 2


def test_error_bars_stay_in_range_for_rates_and_shares():
    assert stats.spread([1960.0, 75000.0, 74000.0]) == (None, None)   # a stalled run among three: too wide
    lo, hi = stats.spread([60000.0, 75000.0, 74000.0])       # on the log scale: above zero, around the
    geo = math.exp(sum(map(math.log, (60000.0, 75000.0, 74000.0))) / 3)   # geometric mean
    assert 0 < lo < geo < hi
    lo, hi = stats.spread([0.01, 0.5, 0.02], share=True)       # a share's bar stays inside (0, 1)
    assert 0 < lo < hi < 1
    lo, hi = stats.spread([-1.0, 1.0])                        # a level that may be negative: plain t
    assert (lo, hi) == pytest.approx((-12.706 * 1.4142 / 1.4142, 12.706), rel=1e-3)


def test_intervals_are_calibrated_on_synthetic_aa_data():
    """200 seeded A/A datasets (5 interleaved pairs; a drift both arms of a pair share, plus 10% run noise
    each): the 95% interval must hold "no change" in 90-99% of them."""
    import random

    rng, held = random.Random(20261201), 0
    for _ in range(200):
        drift = [rng.gauss(0, 0.5) for _ in range(5)]                 # the machine's load, pair by pair
        base = [75000 * math.exp(d + rng.gauss(0, 0.1)) for d in drift]
        treat = [75000 * math.exp(d + rng.gauss(0, 0.1)) for d in drift]
        est = stats.estimate("ratio", base, treat)
        held += bool(est.holds_no_change)
    assert 180 <= held <= 198, held


def test_an_arms_central_value_is_the_median_with_the_middle_two_averaged():
    """report.stats.central: what the arm table, report.csv, the plot data and the PNG show (n = 2, 3, 4;
    the c3 sweep at --repeats 2 showed the larger run, 29,932, for runs of 20,409 and 29,932 tok/s)."""
    from ablate.report.stats import central

    assert central([20409.0, 29932.0]) == 25170.5
    assert central([3.0, 1.0, 2.0]) == 2.0
    assert central([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert central([None, 5.0]) == 5.0 and central([]) is None and central([None]) is None
