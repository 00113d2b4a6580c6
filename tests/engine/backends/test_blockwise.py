"""``blockwise``: equals the materialised reference on every preset."""

import pytest
import torch

from posenc import PositionalAttention, PositionScheme
from posenc._util import relative_error
from tests.support.schemes import _preset

torch.manual_seed(0)


# ------------------------------------------------------------------ fast paths == reference for every preset
TRAINED = list(PositionScheme.presets())


def _attention_schemes(s):
    """The schemes one attention layer runs: a layer pattern's distinct layers, else the scheme itself."""
    return [s] if s.layers is None else list({x.to_json(): x for x in s.layers}.values())


@pytest.mark.parametrize("name", sorted(PositionScheme.presets()))
@pytest.mark.parametrize("n", [130, 256])
def test_blockwise_equals_reference_every_preset(name, n):
    torch.manual_seed(1)
    s = _preset(name)
    if s.max_positions is not None and n > s.max_positions:
        s = PositionScheme.preset(name, train_len=n)
    for layer in _attention_schemes(s):
        m = PositionalAttention(32, 4, layer)
        x = torch.randn(2, n, 32)
        with torch.no_grad():
            ref = m(x, impl="reference")
            fast = m(x, impl="blockwise")
            fused = m(x, impl="sdpa")  # single-branch schemes: fused SDPA; others fall back to blockwise
        assert relative_error(fast, ref) <= 1e-5
        assert relative_error(fused, ref) <= 1e-5
