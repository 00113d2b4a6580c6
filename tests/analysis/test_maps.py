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


@pytest.mark.parametrize(("spec", "params", "length", "same"), [
    ("yarn", {"factor": 1.0}, 64, True),
    ("yarn", {"factor": 2.0}, 64, False),
    ("pi", {"factor": 1.0}, 64, True),
    ("ntk", {"factor": 1.5}, 64, False),
    ("dynamic_ntk", {}, 64, True),  # a dynamic schedule below its threshold (the trained length)
    ("dynamic_ntk", {}, 65, False),  # one past it
    ("rerope", {"window": 20}, 21, True),  # the farthest pair, 20 back, is read at its own distance 20
    ("rerope", {"window": 20}, 22, False),  # 21 back is read at 20
    ("selfextend", {"window": 16, "group": 4}, 17, True),
    ("selfextend", {"window": 16, "group": 4}, 18, False),
    ("streaming_llm", {"window": 30}, 34, True),  # 4 sinks + a window of 30: the first key hidden is at 35 tokens
    ("streaming_llm", {"window": 30}, 35, False),
    ("dca", {"chunk": 24, "local": 4}, 25, True),  # (24, 0) is read at 24 (position_map: every pair at its distance)
    ("dca", {"chunk": 24, "local": 4}, 26, False),  # (25, 0) is not
    ("retrieval", {}, 16, False),  # chooses keys by content: never judged from a probe
    ("resonance", {}, 16, False),  # rounds every wavelength
])
def test_identity_at_is_the_identity_exactly_where_no_pair_is_changed(spec, params, length, same):
    """``identity_at`` on both sides of each method's edge (trained length 64): it says the identity exactly where
    the scheme reads every pair of the length as the untouched one does, as the full position map says (every
    visible pair at its own distance, none hidden, the same frequencies)."""
    from posenc.analysis.maps import identity_at

    assert identity_at(spec, 64, length, params, head_dim=16) is same
    if spec in ("retrieval", "resonance"):
        return
    pm = position_map(spec, 64, length, params, head_dim=16)
    d = torch.arange(length)[:, None] - torch.arange(length)[None]
    exact = bool(torch.equal(pm.visible, d >= 0)) and bool((pm.relative[pm.visible] == d[pm.visible]).all())
    exact &= bool(torch.allclose(pm.inv_freq, pm.default_inv_freq)) if pm.inv_freq is not None else True
    assert exact is same


def test_identity_at_refuses_what_the_scheme_does_not_take():
    from posenc.analysis.maps import identity_at

    assert identity_at("yarn", 64, 64, {"tuned": "longrope_16k"}, head_dim=16) is False
    assert identity_at("none", 64, 4096) is True
