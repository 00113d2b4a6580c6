"""posenc.methods.remaps: STRING's per-length defaults keep positions trained up to twice the length."""

from __future__ import annotations

import pytest
import torch

from posenc import PositionScheme


@pytest.mark.parametrize("n", [4096, 8192, 12000, 16256, 16257, 32768])
def test_string_length_defaults_keep_positions_trained_up_to_twice_the_length(n):
    """The suite's STRING at length n (L = 8192, W = 128): every relative position below L while n <= 2L - W
    (the shift's docstring); past it the shifted piece stays trained and the diagonal one reaches n - L + W - 1."""
    from posenc.evals.suite.spec import method_params

    L, W = 8192, 128
    p = method_params("string", L, n, 64, 1e5, {})
    assert p["local"] == W
    top = PositionScheme.preset("string", train_len=L, **p).build_remap().relative(
        torch.arange(n)[:, None], torch.zeros(1, 1, dtype=torch.long)).max().item()
    shifted = n - 1 - p["shift"] + W
    assert top == (max(p["shift"] - 1, shifted) if n > p["shift"] else n - 1)
    assert (top < L) == (n <= 2 * L - W)
    if n > 2 * L - W:
        assert shifted < L and top == n - L + W - 1
