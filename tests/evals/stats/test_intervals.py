"""Intervals: Wilson against its formula and published values, Student's t against SciPy where installed,
and the separation rule."""

import math

import pytest

from posenc.evals.stats.intervals import (
    Interval,
    mean_interval,
    ppl_interval,
    separated,
    t_quantile,
    wilson,
    z_quantile,
)


def test_wilson_ends_never_cross_the_rate():
    """k = 0 of 10 put the lower end 2.8e-17 above 0 by rounding, which a plot's error bar refused as negative."""
    for n in range(1, 200):
        for k in (0, 1, n // 2, n - 1, n):
            i = wilson(k, n)
            assert i.lo <= i.value <= i.hi, (k, n, i)
    assert wilson(0, 10).lo == 0.0 and wilson(10, 10).hi == 1.0


def test_wilson_matches_the_issue_and_brown_cai_dasgupta():
    i = wilson(71, 128)  # the issue's "plain RoPE fails at 16L": 71/128, [0.47, 0.64]
    assert (round(i.lo, 2), round(i.hi, 2)) == (0.47, 0.64) and i.value == pytest.approx(71 / 128)
    assert wilson(0, 16).lo == 0.0 and wilson(0, 16).hi == pytest.approx(0.1936, abs=1e-4)
    assert wilson(16, 16).hi == 1.0 and wilson(16, 16).lo == pytest.approx(0.8064, abs=1e-4)
    # Brown, Cai, DasGupta (2001) Table: n = 20, k = 10 -> Wilson [0.299, 0.701]
    assert (round(wilson(10, 20).lo, 3), round(wilson(10, 20).hi, 3)) == (0.299, 0.701)
    assert math.isnan(wilson(0, 0).value)
    for bad in ((3, 2), (-1, 4), (1.5, 4)):
        with pytest.raises(ValueError):
            wilson(*bad)
    with pytest.raises(ValueError, match="conf"):
        wilson(1, 2, conf=1.0)


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 8, 9, 30, 120])
@pytest.mark.parametrize("p", [0.025, 0.1, 0.5, 0.9, 0.975])
def test_t_quantile_equals_scipy(df, p):
    stats = pytest.importorskip("scipy.stats")
    assert t_quantile(p, df) == pytest.approx(float(stats.t.ppf(p, df)), abs=1e-9)


def test_t_quantile_known_values_and_errors():
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)  # the 3-seed interval's factor
    assert t_quantile(0.975, 1) == pytest.approx(12.706205, abs=1e-6)
    assert t_quantile(0.975, 5000) == pytest.approx(z_quantile(0.975))
    with pytest.raises(ValueError, match="df"):
        t_quantile(0.5, 0)


def test_mean_and_ppl_intervals():
    i = mean_interval([1.0, 2.0, 3.0])
    assert i.value == 2.0 and i.hi - i.value == pytest.approx(4.302653 / math.sqrt(3), abs=1e-6)
    one = mean_interval([5.0])
    assert not one.known and one.to_dict()["lo"] is None
    p = ppl_interval([2.0, 2.1, 1.9])
    assert p.value == pytest.approx(math.exp(2.0)) and 0 < p.lo < p.value < p.hi
    with pytest.raises(ValueError):
        mean_interval([])


def test_separated_needs_both_intervals_apart():
    a, b = Interval(0.2, 0.1, 0.3, 10), Interval(0.5, 0.35, 0.6, 10)
    assert separated(a, b) and separated(b, a)
    assert not separated(a, Interval(0.3, 0.25, 0.4, 10))
    assert not separated(a, Interval(0.9, math.nan, math.nan, 1))


def test_paired_difference_matches_newcombe_and_the_contingencytables_package():
    """Newcombe's method 10 on the table [[59, 6], [16, 80]]: -0.0621 [-0.1186, -0.0046], the value the R package
    contingencytables (Fagerland, Lydersen and Laake's book, chapter 8) tests for its square-and-add interval."""
    from posenc.evals.stats.intervals import paired_difference

    a = [True] * 59 + [True] * 6 + [False] * 16 + [False] * 80
    b = [True] * 59 + [False] * 6 + [True] * 16 + [False] * 80
    d = paired_difference(a, b)
    assert (round(d.value, 4), round(d.lo, 4), round(d.hi, 4), d.n) == (-0.0621, -0.1186, -0.0046, 161)
    # swapping the two rows mirrors the interval; the correlation narrows it against two unpaired samples
    r = paired_difference(b, a)
    assert (r.value, r.lo, r.hi) == pytest.approx((-d.value, -d.hi, -d.lo))
    ua, ub = wilson(65, 161), wilson(75, 161)
    unpaired = (ua.value - ub.value) - math.sqrt((ua.value - ua.lo) ** 2 + (ub.hi - ub.value) ** 2)
    assert d.lo > unpaired


def test_paired_difference_small_n_edges_and_errors():
    from posenc.evals.stats.intervals import paired_difference

    same = paired_difference([True, False, True, True], [True, False, True, True])
    assert same.value == 0 and same.lo < 0 < same.hi  # equal outcomes still leave an interval around 0
    best = paired_difference([True] * 4, [False] * 4)
    assert best.value == 1 and best.hi == 1 and 0 < best.lo < 1  # 4 of 4 against 0 of 4 is separated from 0
    two = paired_difference([True] * 4, [True, True, False, False])
    assert two.value == 0.5 and two.lo < 0 < two.hi  # 4/4 against 2/4 on 4 trials is not
    assert math.isnan(paired_difference([], []).lo)
    with pytest.raises(ValueError, match="same trials"):
        paired_difference([True], [True, False])
