"""``sdpa``: the fused path used for training gives the reference's gradients."""

import pytest
import torch

from posenc import PositionalAttention, PositionScheme
from posenc._util import assert_close

torch.manual_seed(0)


@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "kerple_log", "xpos", "sinusoidal"])
def test_sdpa_training_path_gradients_equal_reference(name):
    """The fused path used for training gives the same gradients as the materialised reference."""
    s = PositionScheme.preset(name, train_len=32)
    torch.manual_seed(3)
    m = PositionalAttention(32, 4, s)
    x = torch.randn(2, 32, 32)
    grads = []
    for impl in ("reference", "sdpa"):
        m.zero_grad()
        m(x, impl=impl).pow(2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6, name=n)
