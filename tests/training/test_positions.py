"""posenc.training.positions: PoSE's chunks and skips as the paper draws them, randomized ids, and positions that
depend only on seed, step and rank."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from posenc.training.positions import pose_positions, randomized_positions, train_positions
from tests.training.test_train import tiny  # noqa: F401  (the fixture)


# ------------------------------------------------------------------------------------------------ PoSE
def _chunks(ids: np.ndarray) -> list[np.ndarray]:
    """Split ids at every skip (a step other than +1)."""
    cuts = np.flatnonzero(np.diff(ids) != 1) + 1
    return np.split(ids, cuts)


def test_pose_ids_are_consecutive_chunks_with_the_papers_skip_biases():
    rng = np.random.default_rng(0)
    L, Lt = 16, 64
    for chunks in (1, 2, 3, 5):
        for _ in range(200):
            ids = pose_positions(rng, L, Lt, chunks)
            assert ids.shape == (L,) and ids[0] == 0  # chunk 0 has u_0 = 0
            assert np.all(np.diff(ids) >= 1) and ids[-1] <= Lt - 1
            assert len(_chunks(ids)) <= chunks  # two chunks merge when u_i = u_{i-1}
            # skip bias of each token = id - index: non-decreasing (u_i >= u_{i-1}) and within [0, Lt - L]
            u = ids - np.arange(L)
            assert np.all(np.diff(u) >= 0) and 0 <= u.min() and u.max() <= Lt - L


def test_pose_two_chunks_sample_the_cut_and_the_skip_uniformly():
    """N = 2 (the paper's default): the cut l_0 is uniform on {1..L-1}, u_1 uniform on {0..L_t - L}."""
    rng = np.random.default_rng(1)
    L, Lt, n = 8, 20, 8000
    cut, skip = Counter(), Counter()
    for _ in range(n):
        ids = pose_positions(rng, L, Lt, 2)
        u = ids - np.arange(L)
        first = int(np.argmax(u != u[0])) if np.any(u != u[0]) else None
        skip[int(u[-1])] += 1
        if first is not None:
            cut[first] += 1
    assert sorted(skip) == list(range(Lt - L + 1))
    expected = n / (Lt - L + 1)
    assert all(abs(c - expected) < 0.15 * expected for c in skip.values()), skip
    # where u_1 > 0 the cut is visible; it is uniform on 1..L-1
    assert sorted(cut) == list(range(1, L))
    mean = sum(cut.values()) / (L - 1)
    assert all(abs(c - mean) < 0.15 * mean for c in cut.values()), cut


def test_randomized_ids_are_sorted_distinct_and_cover_the_range():
    rng = np.random.default_rng(2)
    L, Lt = 8, 40
    seen = Counter()
    for _ in range(3000):
        ids = randomized_positions(rng, L, Lt)
        assert np.all(np.diff(ids) > 0) and 0 <= ids[0] and ids[-1] < Lt
        seen.update(ids.tolist())
    expected = 3000 * L / Lt  # each id is in a uniform L-subset with probability L / Lt
    assert sorted(seen) == list(range(Lt))
    assert all(abs(c - expected) < 0.15 * expected for c in seen.values())


def test_train_positions_depend_only_on_seed_step_and_rank():
    a = train_positions("pose", 4, 16, 64, seed=3, step=7)
    assert a.shape == (4, 16) and a.dtype == torch.int64
    assert torch.equal(a, train_positions("pose", 4, 16, 64, seed=3, step=7))
    assert not torch.equal(a, train_positions("pose", 4, 16, 64, seed=3, step=8))
    assert not torch.equal(a, train_positions("pose", 4, 16, 64, seed=3, step=7, rank=1))
    assert train_positions("contiguous", 4, 16, 64, seed=3, step=7) is None
    with pytest.raises(ValueError, match="positions must be one of"):
        train_positions("skipwise", 4, 16, 64, seed=0, step=0)
    with pytest.raises(ValueError, match="position_range must be >= train_len"):
        pose_positions(np.random.default_rng(0), 16, 8)
    with pytest.raises(ValueError, match="chunks must be in"):
        pose_positions(np.random.default_rng(0), 4, 8, chunks=5)
