"""``sdpa``: the fused path used for training gives the reference's gradients; queries at the last keys run as two
fused calls."""

import pytest
import torch

from posenc import PositionalAttention, PositionScheme, attention
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("preset,kw", [("rope", {}), ("dynamic_ntk", {"step": 16}), ("yarn", {"factor": 2.0})])
def test_queries_at_the_last_keys_run_as_keys_before_plus_a_causal_square(monkeypatch, preset, kw, dtype):
    """Queries at the positions of the last Nq keys, with keys before them (a chunk after a cache, a dynamic
    schedule's query group): the sdpa path runs the keys before the first query unmasked and the last Nq keys as a
    causal square, merged by log-sum-exp, equal to the reference (GQA, a batch of two, each group of a stepped
    schedule); a call with autograd keeps the one-mask form."""
    import posenc.engine.backends.sdpa as sdpa_mod

    real, seen = sdpa_mod._prefix_and_square, []
    monkeypatch.setattr(sdpa_mod, "_prefix_and_square", lambda *a: seen.append(a[3]) or real(*a))
    s = PositionScheme.preset(preset, train_len=32, **kw)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 40, 16, generator=g, dtype=dtype)
    k, v = (torch.randn(2, 2, 96, 16, generator=g, dtype=dtype) for _ in range(2))
    out = attention(q, k, v, s, impl="sdpa")
    ref = attention(q, k, v, s, impl="reference")
    assert_close(out, ref, rtol=1e-5, atol=1e-6, name=f"{preset} {dtype}")
    # one call, or one per schedule group: queries 56..95 fall in the step blocks 48-63, 64-79, 80-95
    assert seen == ([56, 64, 80] if preset == "dynamic_ntk" else [56])
    seen.clear()
    attention(q.requires_grad_(), k, v, s, impl="sdpa").sum().backward()
    assert seen == [] and q.grad is not None
