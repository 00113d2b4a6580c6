"""Tests for posenc.evals.lab.metrics: perplexity / accuracy with oracle and uniform models, token counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from posenc.evals.lab import metrics as M

V = 61  # vocab size
STEP = 7


def _tokens(n: int) -> np.ndarray:
    """Deterministic sequence over ids 1..V-1 whose next token is a function of the current one;
    id 0 never occurs (so the argmax of uniform logits, 0, is always wrong)."""
    return (1 + (np.arange(n) * STEP) % (V - 1)).astype(np.uint16)


def _next(x: torch.Tensor) -> torch.Tensor:
    return 1 + (x - 1 + STEP) % (V - 1)


def oracle(x):  # huge logit on the true next token
    return F.one_hot(_next(x), V).float() * 100.0


def uniform(x):
    return torch.zeros(*x.shape, V)


@pytest.mark.parametrize("mode", ["nonoverlap", "sliding"])
def test_oracle_and_uniform(mode):
    tokens = _tokens(2000)
    good = M.evaluate_lm(oracle, tokens, 64, mode, batch_size=4, progress=False)
    assert good["ppl"] == pytest.approx(1.0, abs=1e-6) and good["accuracy"] == 1.0
    bad = M.evaluate_lm(uniform, tokens, 64, mode, batch_size=4, progress=False)
    assert bad["ppl"] == pytest.approx(V, rel=1e-6) and bad["loss"] == pytest.approx(math.log(V), rel=1e-6)
    assert bad["accuracy"] == 0.0


def test_token_counts():
    n, L = 1000, 64
    tokens = _tokens(n)
    non = M.evaluate_lm(uniform, tokens, L, "nonoverlap", progress=False)
    assert non["tokens"] == ((n - 1) // L) * L and non["windows"] == (n - 1) // L
    sl = M.evaluate_lm(uniform, tokens, L, "sliding", stride=16, progress=False)
    n_windows = (n - 1 - L) // 16 + 1
    assert sl["windows"] == n_windows and sl["tokens"] == L + (n_windows - 1) * 16
    capped = M.evaluate_lm(uniform, tokens, L, "nonoverlap", max_windows=3, progress=False)
    assert capped["windows"] == 3 and capped["tokens"] == 3 * L


def test_sliding_scores_each_target_once_with_its_own_context():
    """A context-free (bigram) model: the sliding loss must equal the mean bigram loss over exactly
    the targets 1..last, whatever the window layout."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, 900).astype(np.int64)
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(0))
    bigram = lambda x: table[x]  # [B, N, V]
    L, s = 50, 20
    out = M.evaluate_lm(bigram, tokens, L, "sliding", stride=s, batch_size=3, progress=False)
    last = L + (out["windows"] - 1) * s  # index of the last counted target
    t = torch.from_numpy(tokens)
    ref = F.cross_entropy(table[t[:last]], t[1:last + 1], reduction="mean").item()
    assert out["loss"] == pytest.approx(ref, rel=1e-6) and out["tokens"] == last


def test_batch_size_does_not_change_results():
    tokens = np.random.default_rng(1).integers(0, V, 700)
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(1))
    a = M.evaluate_lm(lambda x: table[x], tokens, 32, progress=False, batch_size=1)
    b = M.evaluate_lm(lambda x: table[x], tokens, 32, progress=False, batch_size=5)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-9) and a["accuracy"] == b["accuracy"]


def test_per_position_loss():
    L = 64

    def half(x):  # uniform on the first half of each window, oracle on the second
        out = uniform(x)
        out[:, L // 2:] = oracle(x)[:, L // 2:]
        return out

    r = M.evaluate_lm(half, _tokens(1000), L, per_position_loss=True, position_buckets=4, progress=False)
    assert r["position_edges"] == [0, 16, 32, 48, 64]
    np.testing.assert_allclose(r["position_loss"], [math.log(V)] * 2 + [0.0] * 2, atol=1e-5)
    assert r["accuracy"] == pytest.approx(0.5)


def test_bad_logits_and_lengths():
    with pytest.raises(ValueError, match="logits_fn"):
        M.evaluate_lm(lambda x: torch.zeros(1, 3, V), _tokens(200), 16, progress=False)
    with pytest.raises(ValueError, match="seq_len"):
        M.evaluate_lm(uniform, _tokens(10), 16, progress=False)


def test_perplexity_vs_length():
    rows = M.perplexity_vs_length(uniform, _tokens(3000), [32, 128], max_tokens=256, progress=False)
    assert [r["eval_len"] for r in rows] == [32, 128]
    assert [r["tokens"] for r in rows] == [256, 256]
    assert all(r["ppl"] == pytest.approx(V, rel=1e-6) for r in rows)


def test_tail_mode_scores_the_same_targets_with_more_context_and_an_interval():
    """evaluate_lm in tail mode: the same number of scored tokens at every length, the same loss for a
    context-free model (a unigram oracle), and the perplexity's interval over the windows around it."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 8, size=3000)
    bias = torch.randn(8)

    def unigram(x):  # ignores the context: the same targets give the same loss at every length
        return bias.expand(*x.shape, 8)

    rows = [M.evaluate_lm(unigram, tokens, n, "tail", batch_size=4, max_windows=12, progress=False,
                          target_len=32, context_max=256) for n in (32, 64, 256)]
    assert [r["tokens"] for r in rows] == [12 * 32] * 3
    assert rows[0]["loss"] == pytest.approx(rows[1]["loss"]) == pytest.approx(rows[2]["loss"])
    assert all(r["ppl_lo"] < r["ppl"] < r["ppl_hi"] and r["windows"] == 12 for r in rows)
    one = M.evaluate_lm(unigram, tokens, 32, "tail", max_windows=1, progress=False, target_len=32, context_max=256)
    assert one["ppl_lo"] is None and one["ppl_hi"] is None
