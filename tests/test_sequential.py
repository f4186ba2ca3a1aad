"""Repeats that stop by themselves: Bonferroni over the looks keeps the false-positive rate of peeking at or
below 5% (seeded synthetic A/A sequences). A real sweep that stops by itself: test_report.py."""
import math
import random

import pytest

from ablate.report import sequential, stats


def false_positive_rate(level: float, looks=range(2, 11), sequences: int = 2000, sd: float = 0.1) -> float:
    """Share of A/A sequences (true ratio exactly x1) that any look declares decided against x1."""
    rng, wrong = random.Random(7), 0
    for _ in range(sequences):
        logs = [rng.gauss(0, sd) for _ in range(max(looks))]
        for n in looks:
            est = stats.estimate("ratio", [1.0] * n, [math.exp(x) for x in logs[:n]], level=level)
            if stats.verdict(1.0, 0.0, "higher", est) != "inconclusive":
                wrong += 1
                break
    return wrong / sequences


def test_peeking_with_corrected_intervals_keeps_false_positives_at_or_below_5_percent():
    corrected = sequential.level(2, 10)               # 9 looks: each at 1 - 0.05 / 9
    assert corrected == pytest.approx(1 - 0.05 / 9)
    assert false_positive_rate(corrected) <= 0.05
    assert false_positive_rate(0.95) > 0.10           # the same peeking at plain 95% intervals


def test_the_decision_names_what_is_still_open():
    class C:
        def __init__(self, claim, metric, claimed, verdict):
            self.claim, self.metric, self.claimed, self.verdict = claim, metric, claimed, verdict

    open_ = [C("C3", "tokens_per_s", 2.2, "inconclusive"), C("C3", "comm_bytes_per_step", 0.875, "reproduced"),
             C("C3", "comm_exposed_s", None, "no claim")]
    assert sequential.decision(open_, 2, 4) == (False, "n=2: C3 tokens_per_s still inconclusive")
    assert sequential.decision(open_, 4, 4) == (True, "max repeats reached (n=4): C3 tokens_per_s still inconclusive")
    assert sequential.decision(open_[1:], 3, 4) == (True, "every verdict decided at n=3")
