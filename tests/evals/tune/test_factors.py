"""posenc.evals.tune.factors: LongRoPE's initial factor vectors (PI, NTK, YaRN's ramp as transformers has it) and the
evolutionary search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from posenc.evals.tune.factors import INIT_RULES, evolve, initial_factors, is_monotone


# ------------------------------------------------------------------------------------------------ factors
def test_initial_factors_are_pi_ntk_and_yarn():
    d, s, base = 64, 4.0, 10000.0
    i = np.arange(d // 2)
    theta = base ** (-2 * i / d)
    assert np.all(initial_factors("pi", s, d, base, 2048) == s)
    ntk = initial_factors("ntk", s, d, base, 2048)
    # NTK-aware: the base becomes b * s^(d/(d-2)); lambda_i = theta_i / theta_i'
    ntk_theta = (base * s ** (d / (d - 2))) ** (-2 * i / d)
    np.testing.assert_allclose(ntk, theta / ntk_theta, atol=1e-4)
    assert ntk[0] == 1.0 and ntk[-1] == pytest.approx(s)
    yarn = initial_factors("yarn", s, d, base, 2048)
    turns = 2048 * theta / (2 * math.pi)
    assert np.all(yarn[turns > 64] == 1.0) and np.all(yarn[turns < 0.5] == s)  # NTK-by-parts' two ends
    for rule in INIT_RULES:
        assert is_monotone(initial_factors(rule, s, d, base, 2048), s)
    with pytest.raises(ValueError, match="rule must be one of"):
        initial_factors("linear", s, d, base, 2048)
    with pytest.raises(ValueError, match="factor must be a number >= 1"):
        initial_factors("pi", 0.5, d, base, 2048)


def test_the_search_breeds_children_for_a_real_head_dim():
    """head_dim 64 (SmolLM2's 32 pairs) from PI, NTK and YaRN at s = 2: every evaluation of the budget is a new
    monotone vector (drawing children until one happened to be monotone bred none here, and the 16k tune
    evaluated only the three rule vectors)."""
    d, s, base, train = 64, 2.0, 1e5, 8192
    init = {r: initial_factors(r, s, d, base, train) for r in INIT_RULES}
    found = evolve(lambda lam: float(np.sum((np.log(lam) - np.log(1.5)) ** 2)), init, 16, max_factor=2 * s, seed=0)
    assert len(found) == 16 and len({tuple(r["factors"]) for r in found}) == 16
    assert all(is_monotone(r["factors"], 2 * s) for r in found)
    assert sum(r["name"].startswith("gen") for r in found) >= 8


def test_yarn_initial_factors_follow_the_ramp_of_transformers():
    d, s, base, train = 32, 4.0, 10000.0, 256
    from posenc.parts.frequencies import yarn_correction_range

    low, high = yarn_correction_range(d, base, train, 32, 1)
    lam = initial_factors("yarn", s, d, base, train)
    i = np.arange(d // 2)
    gamma = 1 - np.clip((i - low) / (high - low), 0, 1)  # 1: pair left alone, 0: interpolated by s
    np.testing.assert_allclose(lam, 1 / ((1 - gamma) / s + gamma), atol=1e-4)
    assert lam[0] == 1.0 and lam[-1] == pytest.approx(s)


def test_evolution_improves_a_known_objective_and_keeps_the_constraint():
    """Score: squared log-distance to a monotone optimum none of the rules is; the search must get closer than
    every rule, evaluate only monotone vectors in [1, max_factor], respect the budget, and be reproducible."""
    d, s = 32, 4.0
    init = {r: initial_factors(r, s, d, 10000.0, 256) for r in INIT_RULES}
    best_vec = np.round(np.clip(np.linspace(1.0, 1.3 * s, d // 2) ** 1.1, 1.0, 2 * s), 4)
    best_vec = np.maximum.accumulate(best_vec)

    def score(lam):
        assert is_monotone(lam, 2 * s)
        return float(np.sum((np.log(lam) - np.log(best_vec)) ** 2))

    found = evolve(score, init, 80, max_factor=2 * s, seed=0)
    assert len(found) == 80 and len({tuple(r["factors"]) for r in found}) == 80
    start = min(score(v) for v in init.values())
    assert found[0]["score"] < 0.5 * start
    assert all(is_monotone(r["factors"], 2 * s) for r in found)
    assert [r["score"] for r in found] == sorted(r["score"] for r in found)
    again = evolve(score, init, 80, max_factor=2 * s, seed=0)
    assert [r["factors"] for r in again] == [r["factors"] for r in found]
    with pytest.raises(ValueError, match="break the constraint"):
        evolve(score, {"bad": np.array([2.0, 1.0] * 8)}, 4, max_factor=2 * s)
