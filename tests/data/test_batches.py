"""Tests for posenc.data.batches: reproducible training batches, rank sharding, evaluation windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.data import batches as B

# ----------------------------------------------------------------------------------------- batches


def test_batch_iterator_resumes_exactly():
    tokens = np.arange(5000, dtype=np.uint16)
    full = [b for _, b in zip(range(7), B.batch_iterator(tokens, 4, 16, seed=3))]
    resumed = list(B.batch_iterator(tokens, 4, 16, seed=3, start_step=4, num_steps=3))
    for (x1, y1), (x2, y2) in zip(full[4:], resumed):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    x, y = full[0]
    assert x.dtype == torch.long and x.shape == (4, 16)
    assert torch.equal(y, x + 1)  # tokens are arange, so a window is consecutive and y is x shifted
    other = next(B.batch_iterator(tokens, 4, 16, seed=4))
    assert not torch.equal(other[0], x)
    assert not torch.equal(full[1][0], x)


def test_batch_rank_sharding():
    tokens = np.random.default_rng(0).integers(0, 257, 3000).astype(np.uint16)
    gx, gy = B.get_batch(tokens, 8, 32, seed=1, step=5)
    parts = [B.get_batch(tokens, 8, 32, seed=1, step=5, rank=r, world_size=4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), gx)
    assert torch.equal(torch.cat([p[1] for p in parts]), gy)
    it = B.batch_iterator(tokens, 8, 32, seed=1, start_step=5, rank=2, world_size=4)
    assert torch.equal(next(it)[0], parts[2][0])
    with pytest.raises(ValueError, match="world_size"):
        B.get_batch(tokens, 6, 32, 1, 0, world_size=4)
    with pytest.raises(ValueError, match="rank"):
        B.get_batch(tokens, 8, 32, 1, 0, rank=4, world_size=4)
    with pytest.raises(ValueError, match="seq_len"):
        B.get_batch(tokens[:10], 2, 32, 1, 0)


def test_eval_windows_cover_targets():
    tokens = np.arange(1000)
    wins = list(B.eval_windows(tokens, 100))
    assert len(wins) == 9 and all(f == 0 and len(w) == 101 for w, f in wins)
    np.testing.assert_array_equal(wins[1][0], np.arange(100, 201))
    counted = []
    for w, f in B.eval_windows(tokens, 100, mode="sliding", stride=30):
        assert len(w) == 101
        counted += w[1:][f:].tolist()
    assert counted == list(range(1, len(counted) + 1)) and len(counted) > 950  # each target once
    capped = list(B.eval_windows(tokens, 100, max_windows=3))
    assert [int(w[0]) for w, _ in capped] == [0, 400, 800]
    with pytest.raises(ValueError, match="mode"):
        list(B.eval_windows(tokens, 100, mode="bogus"))
    with pytest.raises(ValueError, match="stride"):
        list(B.eval_windows(tokens, 100, mode="sliding", stride=101))


def test_tail_windows_score_the_same_targets_at_every_length():
    """Like-for-like perplexity: at every length the scored targets are the same tokens (the last T of windows
    ending at the same places), and a longer length only adds context in front of them."""
    n_tokens, T, C = 5000, 64, 512
    scored = {}
    for n in (64, 128, 256, 512):
        starts, score_from = B.eval_window_starts(n_tokens, n, "tail", max_windows=20, target_len=T, context_max=C)
        assert len(starts) == 20 and (starts >= 0).all() and (starts + n < n_tokens).all()
        assert (score_from == n - T).all()
        # targets of window s are tokens s+1 .. s+n; the scored ones s+1+score_from .. s+n
        scored[n] = np.concatenate([np.arange(s + 1 + f, s + n + 1) for s, f in zip(starts, score_from)])
    for n in (128, 256, 512):
        assert np.array_equal(scored[n], scored[64])
    assert len(np.unique(scored[64])) == 20 * T  # the windows' targets do not overlap
    with pytest.raises(ValueError, match="target_len"):
        B.eval_window_starts(n_tokens, 64, "tail")
    with pytest.raises(ValueError, match="context_max"):
        B.eval_window_starts(n_tokens, 1024, "tail", target_len=T, context_max=C)
