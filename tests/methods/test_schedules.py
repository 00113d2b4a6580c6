"""posenc.methods.schedules: p-RoPE's record and its errors."""

from __future__ import annotations

import pytest

from posenc import PositionScheme
from posenc.methods import METHODS


def test_p_rope_record_and_errors():
    s = PositionScheme.preset("p_rope", train_len=32, p=0.5)
    assert s.rope.scaling == {"rope_type": "proportional", "partial_rotary_factor": 0.5}
    assert METHODS["p_rope"].hf_rope_type == "proportional"
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="p"):
            PositionScheme.preset("p_rope", train_len=32, p=bad)
    with pytest.raises(ValueError, match="do not stack"):
        PositionScheme.preset("yarn", train_len=32, factor=2.0).extend("p_rope")
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        PositionScheme.preset("rope", partial_rotary_factor=0.5).extend("p_rope")
