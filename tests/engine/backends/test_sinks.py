"""``sinks``: attention sinks + a window under a remap (StreamingLLM's re-indexing, LM-Infinite's distance
ceiling) equal the reference."""

from dataclasses import replace

import pytest
import torch

from posenc import PositionScheme, attention
from posenc._util import relative_error


@pytest.mark.parametrize("name,params", [("streaming_llm", {"window": 60, "n_sinks": 4}),
                                         ("lm_infinite", {"window": 64, "n_global": 5}),
                                         ("sliding_window+rerope", {"window": 48})])
def test_sinks_and_window_equal_reference(name, params, calls):
    """Attention sinks + a window under a remap (StreamingLLM's re-indexing, LM-Infinite's distance
    ceiling): the window piece on the Toeplitz kernel, the sinks piece materialised, merged by LSE; for a
    full forward and for a run of queries continuing a cache."""
    torch.manual_seed(8)
    if name == "sliding_window+rerope":  # a window under a ReRoPE remap: both branches reach the window
        s = PositionScheme.preset("rerope", train_len=64, window=16)
        s = replace(s, mask=replace(s.mask, window=params["window"]))
    else:
        s = PositionScheme.preset(name, train_len=64, **params)
    q, k, v = (torch.randn(2, 4, 300, 16) for _ in range(3))
    for q0 in (0, 170):
        qp, kp = torch.arange(q0, 300), torch.arange(300)
        ref = attention(q[:, :, q0:], k, v, s, q_pos=qp, k_pos=kp, impl="reference")
        out = attention(q[:, :, q0:], k, v, s, q_pos=qp, k_pos=kp, impl="flex")
        assert relative_error(out, ref) <= 1e-5, (name, q0)
    # the window under ReRoPE straddles two branches: no single branch holds it, the blockwise path runs
    assert calls["calls"] == (0 if name == "sliding_window+rerope" else 2)
