"""Intervals: Wilson against its formula and published values, Student's t against SciPy where installed,
and the separation rule."""

import math

import pytest

from posenc.lab.stats import Interval, mean_interval, ppl_interval, separated, t_quantile, wilson, z_quantile


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
