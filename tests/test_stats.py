"""Evaluation intervals: Wilson for one rate, Newcombe's paired interval for two models on the
same seeds (trainer.stats), checked against published values and hand counts."""
from __future__ import annotations

import pytest
from pytest import approx


def test_wilson_matches_newcombes_published_intervals():
    from trainer.stats import wilson

    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I
    assert wilson(81, 263) == approx((0.2553, 0.3662), abs=1e-4)
    assert wilson(15, 148) == approx((0.0624, 0.1605), abs=1e-4)
    assert wilson(0, 20) == approx((0.0, 0.1611), abs=1e-4)
    assert wilson(1, 29) == approx((0.0061, 0.1718), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)
    # no successes (or all): the interval holds the observed rate exactly, with no rounding crumb
    for n in range(1, 200):
        assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0
    with pytest.raises(ValueError, match="successes=3, n=2"):
        wilson(3, 2)


def test_rate_reports_episodes_and_interval():
    from trainer.stats import fmt_rate, rate

    r = rate([True, False, False, True, False])
    assert r["episodes"] == 5 and r["success"] == 0.4
    lo, hi = r["ci95"]
    assert lo < 0.4 < hi
    assert fmt_rate(r) == f"0.40 [{lo:.2f}, {hi:.2f}] (n=5)"


def test_paired_difference_uses_the_pairing():
    """Two models that agree on most seeds: the paired interval is narrower than treating the two
    rates as independent samples, holds the observed difference, and flips with the order."""
    from trainer.stats import paired_difference, wilson

    first = [True] * 30 + [False] * 60 + [False] * 10
    second = [True] * 30 + [False] * 60 + [True] * 10  # the second also wins 10 seeds the first lost
    d = paired_difference(first, second)
    assert d["episodes"] == 100 and d["diff"] == approx(0.10) and d["discordant"] == [0, 10]
    lo, hi = d["ci95"]
    assert 0 < lo < 0.10 < hi  # ten wins and no losses: the gain is real
    l1, u1 = wilson(30, 100)
    l2, u2 = wilson(40, 100)
    independent = (0.10 - ((0.30 - l1) ** 2 + (u2 - 0.40) ** 2) ** 0.5)
    assert lo > independent  # pairing removed the shared noise
    back = paired_difference(second, first)
    assert back["ci95"] == approx([-hi, -lo])
    # the same outcomes: no difference, an interval around zero
    same = paired_difference(first, first)
    assert same["diff"] == 0 and same["ci95"][0] < 0 < same["ci95"][1]
    with pytest.raises(ValueError, match="same episodes"):
        paired_difference([True], [True, False])
