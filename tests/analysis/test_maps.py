"""posenc.analysis.maps: the map read from a method's scheme equals each remap's own formula, its mask is what the
engine's attention lets through, and its schedule is the scheme's."""

from __future__ import annotations

import pytest
import torch

from posenc.analysis.maps import method_scheme, position_map
from posenc.engine import attention
from posenc.methods import METHODS, TRAINED_METHODS

N, L = 40, 16


def test_rerope_reads_min_of_distance_and_window_on_the_causal_triangle():
    pm = position_map("rerope", L, N, {"window": 6})
    d = torch.arange(N)[:, None] - torch.arange(N)[None, :]
    causal = d >= 0
    assert torch.equal(pm.visible, causal)
    assert torch.equal(pm.relative[causal], d.clamp(max=6)[causal].double())
    assert pm.relative[~causal].isnan().all() and pm.max_read == 6 and pm.params == {"window": 6}


@pytest.mark.parametrize("name", list(METHODS))
def test_map_equals_the_remap_formula_and_the_mask_equals_the_engine(name):
    """The relative positions (taken branch by branch, as the reference backend rotates) equal the remap's closed form
    ``relative(qp, kp)``, and a pair is visible exactly where the engine's attention gives its key weight (values =
    one-hot keys, so the output row is the attention row), content-chosen keys included (the same seeded q, k)."""
    pm = position_map(name, L, N, head_dim=N, seed=3)
    scheme = method_scheme(name, L, N, head_dim=N)[0].layer(0)
    pos = torch.arange(N)
    formula = scheme.build_remap().relative(pos[:, None], pos[None, :]).double().expand(N, N)
    assert torch.allclose(pm.relative[pm.visible], formula[pm.visible])
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 1, N, N, generator=gen, dtype=torch.float64) for _ in range(2))
    if not pm.content:
        q, k = 0.1 * q, 0.1 * k
    weights = attention(q, k, torch.eye(N, dtype=torch.float64)[None, None], scheme, impl="reference")[0, 0]
    assert torch.equal(weights > 0, pm.visible)


def test_schedule_is_the_schemes_and_a_dynamic_one_is_read_at_the_length():
    from posenc.parts.frequencies import rope_frequencies

    yarn = position_map("yarn", L, N)
    scheme = method_scheme("yarn", L, N)[0]
    assert torch.allclose(yarn.inv_freq, rope_frequencies(64, 10000.0, scheme.rope.scaling).inv_freq.double())
    assert torch.allclose(yarn.default_inv_freq, rope_frequencies(64, 10000.0).inv_freq.double())
    dyn = position_map("dynamic_ntk", L, N)
    assert not torch.allclose(dyn.inv_freq, dyn.default_inv_freq)  # NTK at N > L
    assert torch.allclose(position_map("dynamic_ntk", L, L).inv_freq, dyn.default_inv_freq)  # and none at L
    at_n, trained = yarn.turns()
    assert at_n.shape == trained.shape == (32,)


def test_trained_in_schemes_and_parameters():
    for name in TRAINED_METHODS:
        pm = position_map(name, L, N)
        assert pm.inv_freq is None and pm.turns() is None and pm.max_read == N - 1
    assert position_map("alibi", L, N).inv_freq is None
    assert position_map("yarn", L, N, {"factor": 8}).params["factor"] == 8
    with pytest.raises(ValueError, match="not used by method"):
        position_map("yarn", L, N, {"bogus": 1})
    with pytest.raises(ValueError, match="unknown"):
        position_map("yran", L, N)
