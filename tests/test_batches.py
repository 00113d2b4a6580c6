"""Tests for posenc.lab.batches: reproducible training batches, rank sharding, evaluation windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.lab import batches as B

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
