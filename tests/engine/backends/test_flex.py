"""``flex``: compiled FlexAttention against the materialised reference on every preset, below and across its
128-token block; its fallbacks, its block masks against the dense mask, the one message of a first compile per
shape, and the branch regions it runs (each pair given to the last branch holding it)."""

from __future__ import annotations

import pytest
import torch

from posenc import PositionalAttention, PositionScheme, attention
from posenc._util import assert_close, relative_error
from posenc.engine.backends import flex as flex_backend
from posenc.parts.masks import MaskSpec, materialize
from tests.support.attention import _qkv
from tests.support.schemes import _preset

torch.manual_seed(0)


# ------------------------------------------------------------------ fast paths == reference for every preset
TRAINED = list(PositionScheme.presets())


# a layer pattern's layers are covered through their own presets (chunked_attention, sliding_window, rope, nope,
# temperature_tuning): each compile costs seconds, so the patterns themselves are not compiled again here
@pytest.mark.compile
@pytest.mark.parametrize("name", sorted(n for n in PositionScheme.presets()
                                        if _preset(n).layers is None))
def test_flex_equals_reference(name):
    """impl="flex" vs the materialised reference for every preset, at a length that is and one that is
    not a multiple of the 128-token block. Single-branch schemes run compiled FlexAttention (score_mod +
    block mask); multi-branch remaps and content-relative terms take the documented blockwise fallback."""
    torch.manual_seed(2)
    s = _preset(name)
    if s.max_positions is not None and s.max_positions < 256:
        s = PositionScheme.preset(name, train_len=256)
    m = PositionalAttention(32, 4, s).eval()
    for n in (256, 200):
        x = torch.randn(2, n, 32)
        with torch.no_grad():
            ref = m(x, impl="reference")
            fast = m(x, impl="flex")
        assert relative_error(fast, ref) <= 1e-5, (name, n)


def test_flex_falls_back_for_multi_branch_and_grad():
    from posenc.engine.backends import BY_NAME
    from posenc.engine.dispatch import make_call

    def why_not(name, grad):
        q, k, v = (t.requires_grad_(grad) for t in _qkv(N=8, D=8))
        return BY_NAME["flex"].why_not(make_call(PositionalAttention(32, 4, _preset(name)).parts, q, k, v))

    assert "branches" in why_not("rerope", False)
    assert "backward" in why_not("rope", True)
    assert why_not("rope", False) is None


@pytest.mark.parametrize("mask", [MaskSpec(window=70, n_sinks=3), MaskSpec(), MaskSpec(block=50),
                                  MaskSpec(window=64)])
@pytest.mark.parametrize("use_intervals", [False, True])
def test_block_mask_matches_dense(mask, use_intervals):
    from posenc.engine import build_block_mask

    p = torch.arange(300)[None]
    bm = build_block_mask(mask.allowed, p, p, block=64, key_intervals=mask.key_intervals if use_intervals else None)
    dense = materialize(mask, p, p)[0, 0]
    nb = (300 + 63) // 64
    for i in range(nb):
        rows = dense[i * 64:(i + 1) * 64]
        partial = {j for j in range(nb) if rows[:, j * 64:(j + 1) * 64].any()}
        full = {j for j in partial if rows.shape[0] == 64 and rows[:, j * 64:(j + 1) * 64].all()
                and (j + 1) * 64 <= 300}
        got_partial = set(bm.kv_indices[0, 0, i, : bm.kv_num_blocks[0, 0, i]].tolist())
        got_full = set(bm.full_kv_indices[0, 0, i, : bm.full_kv_num_blocks[0, 0, i]].tolist())
        assert got_full == full and got_partial == partial - full


@pytest.mark.compile
def test_flex_compile_says_so_once_per_shape(caplog, monkeypatch):
    """The first compiled-flex call of a shape announces the wait (the CLI shows posenc's INFO log);
    the second call of that shape is silent."""
    import logging

    import posenc.engine.backends.flex as flex_backend

    monkeypatch.setattr(flex_backend, "_FLEX_SEEN", set())  # as in a fresh process

    q, k, v = _qkv(B=1, N=200)
    s = PositionScheme.preset("alibi")
    with caplog.at_level(logging.INFO, logger="posenc"):
        attention(q, k, v, s, impl="flex")
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        attention(q, k, v, s, impl="flex")
        second = [r.getMessage() for r in caplog.records]
    assert any("compiling FlexAttention" in m and "200 x 200" in m for m in first), first
    assert any("ready in" in m for m in first) and second == []


@pytest.mark.compile
def test_flex_below_and_across_the_block_equals_reference():
    """Compiled CPU flex in torch 2.13 is wrong on blocks shorter than 128 (N=40 differed by 0.8-1.9, and
    5 queries after a 51-token prefix gave NaN); posenc pads to whole blocks. Lengths 1..128 and the
    decode-like 5 x 56 all pad to one 128 x 128 shape, 129 and 200 to 256: two compiles."""
    s = PositionScheme.preset("alibi")
    for nq, nk in [(1, 1), (40, 40), (127, 127), (128, 128), (129, 129), (200, 200), (5, 56)]:
        q, k, v = _qkv(B=2, N=nk, seed=nq)
        q = q[:, :, nk - nq:]
        ref = attention(q, k, v, s, impl="reference")
        for _ in range(2):  # identical calls agree (no uninitialised reads)
            assert relative_error(attention(q, k, v, s, impl="flex"), ref) <= 1e-5, (nq, nk)
    km = torch.ones(2, 40, dtype=torch.bool)
    km[1] = False  # a row of all padding: 0 on every path
    km[0, :30] = False
    q, k, v = _qkv(B=2, N=40)
    assert_close(attention(q, k, v, s, impl="flex", key_mask=km),
                 attention(q, k, v, s, impl="reference", key_mask=km), rtol=1e-5, atol=1e-6)


def test_effective_regions_give_each_pair_to_the_last_branch_holding_it():
    """A pair in two branches' regions belongs to the later one (the reference's rule); a later branch without
    a region takes every pair (the earlier ones are dropped)."""
    from dataclasses import dataclass

    from posenc.parts.branches import Branch

    @dataclass
    class Parts:
        branches: list

    a, b = (lambda q, k: q - k < 5), (lambda q, k: q - k >= 3)
    qp, kp = torch.arange(10)[:, None], torch.arange(10)[None]
    regions = flex_backend.effective_regions(Parts([Branch(region=a), Branch(region=b)]))
    assert [i for i, _ in regions] == [0, 1]
    assert torch.equal(regions[0][1](qp, kp), (qp - kp < 3))
    assert torch.equal(regions[1][1](qp, kp), b(qp, kp))
    assert [i for i, _ in flex_backend.effective_regions(Parts([Branch(region=a), Branch()]))] == [1]
