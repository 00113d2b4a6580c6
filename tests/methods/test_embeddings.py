"""posenc.methods.embeddings: the hierarchical method checks alpha when applied."""

from __future__ import annotations

import re

import pytest

from posenc import PositionScheme

P = PositionScheme


def test_the_hierarchical_method_checks_alpha_when_applied():
    learned = P.preset("learned", train_len=64)
    assert learned.extend("hierarchical", alpha=0.25).embedding.params["alpha"] == 0.25
    for bad in (0.0, 1.0, "x", [0.4]):
        with pytest.raises(ValueError, match=rf"^hierarchical.alpha must be > 0 and < 1, got {re.escape(repr(bad))}$"):
            learned.extend("hierarchical", alpha=bad)
