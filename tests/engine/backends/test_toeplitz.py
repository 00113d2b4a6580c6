"""``toeplitz``: the engine path of distance-only biases against the materialised reference for every
translation-invariant bias and the sliding window (forward, gradients, prefill then decode, bf16), and the
dispatch (``impl="auto"`` takes it only where it applies; a bias that is not translation invariant is declined)."""

from dataclasses import replace

import pytest
import torch

from posenc import PositionalAttention, PositionScheme, attention
from posenc._util import relative_error
from posenc.models.cache import KVCache
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.parts.biases import BIASES

# biases that are a function of the distance alone (FIRE normalises by the query position: it is not)
INVARIANT = sorted(n for n, cls in BIASES.items() if cls(num_heads=3).translation_invariant)


def _scheme(name):
    if name == "sliding_window":
        return PositionScheme.preset(name, train_len=64, window=50)
    if name == "rope+alibi":
        return replace(PositionScheme.preset("alibi", train_len=64), rope=PositionScheme.preset("rope").rope)
    return PositionScheme.preset(name, train_len=64)


def test_a_bias_that_is_not_translation_invariant_is_declined(calls):
    """FIRE's bias depends on the query position: the Toeplitz kernel declines it (a forced "toeplitz" falls
    back, as dispatch.FALLBACKS says) and every path gives the reference's answer without calling the kernel."""
    torch.manual_seed(3)
    m = PositionalAttention(32, 4, _scheme("fire")).eval()
    x = torch.randn(2, 200, 32)
    with torch.no_grad():
        ref = m(x, impl="reference")
        assert relative_error(m(x, impl="auto"), ref) <= 1e-5
        assert relative_error(m(x, impl="toeplitz"), ref) <= 1e-5
    assert calls["calls"] == 0


@pytest.mark.parametrize("name", INVARIANT + ["sliding_window", "rope+alibi"])
def test_engine_path_equals_reference(name, calls):
    torch.manual_seed(3)
    m = PositionalAttention(32, 4, _scheme(name)).eval()
    for n in (200, 300):
        x = torch.randn(2, n, 32)
        with torch.no_grad():
            ref = m(x, impl="reference")
            auto = m(x, impl="auto")
            forced = m(x, impl="toeplitz")
        assert relative_error(auto, ref) <= 1e-5, (name, n)
        assert relative_error(forced, ref) <= 1e-5, (name, n)
    assert calls["calls"] == 4


@pytest.mark.parametrize("name", ["alibi", "sandwich", "sliding_window", "rope+alibi"])
def test_training_gradients_equal_reference(name, calls):
    """Fixed biases train through the Toeplitz path (the flash kernel's backward): same loss and gradients
    for every projection as the materialised reference."""
    torch.manual_seed(6)
    m = PositionalAttention(32, 4, _scheme(name))
    x = torch.randn(2, 100, 32)
    grads = []
    for impl in ("reference", "auto"):
        m.zero_grad()
        out = m(x, impl=impl)
        (out * torch.linspace(-1, 1, 32)).sum().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    assert calls["calls"] == 1
    for a, b in zip(*grads):
        assert relative_error(b, a) <= 1e-5


def test_auto_skips_it_where_it_does_not_apply(calls):
    torch.manual_seed(4)
    x = torch.randn(2, 100, 32)
    alibi = PositionalAttention(32, 4, _scheme("alibi"))
    with torch.no_grad():
        for name in ("rope", "lm_infinite", "streaming_llm", "bca"):  # no bias / sinks / blocks
            PositionalAttention(32, 4, PositionScheme.preset(name, train_len=64))(x, impl="auto")
        alibi(x[:, :10], impl="auto")  # too few queries: a small materialised mask is as cheap
        alibi(x, impl="auto", positions=torch.arange(100) * 2)  # positions are not 0..N-1
        alibi(x, impl="auto", key_mask=torch.ones(2, 100, dtype=torch.bool))  # padding keys
    assert calls["calls"] == 0
    t5 = PositionalAttention(32, 4, _scheme("t5"))
    out = t5(x, impl="auto")  # training: the table needs gradients, so SDPA with a materialised bias
    out.sum().backward()
    assert calls["calls"] == 0 and t5.parts.bias.weight.grad is not None
    with torch.no_grad():
        alibi(x, impl="auto")
    assert calls["calls"] == 1


def test_prefill_then_decode_equals_full_forward(calls):
    """A 100-token prefill takes the Toeplitz path (queries after no cached keys); decode steps append."""
    torch.manual_seed(5)
    model = TinyLM(LMConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, scheme=_scheme("alibi"),
                            train_len=64)).eval()
    ids = torch.randint(0, 64, (2, 130))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache.for_model(model, 2)
        parts = [model(ids[:, :100], cache=cache)]
        parts += [model(ids[:, t:t + 1], cache=cache) for t in range(100, 130)]
    assert calls["calls"] >= 2  # the full forward and the prefill, per layer
    assert relative_error(torch.cat(parts, dim=1), full) <= 1e-5


def test_functional_attention_with_odd_value_width_falls_back():
    q, k = torch.randn(1, 4, 100, 16), torch.randn(1, 4, 100, 16)
    v = torch.randn(1, 4, 100, 8)  # the flash kernel needs equal widths: another path runs
    s = _scheme("alibi")
    out = attention(q, k, v, s, impl="toeplitz")
    ref = attention(q, k, v, s, impl="reference")
    assert relative_error(out, ref) <= 1e-5


def test_bfloat16_inputs_stay_close_to_float32(calls):
    """bf16 q/k/v (the bias profile is cast to bf16 too) against the fp32 result: bf16 rounding only."""
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 4, 150, 16) for _ in range(3))
    s = _scheme("alibi")
    ref = attention(q, k, v, s, impl="reference")
    out = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), s, impl="toeplitz")
    assert out.dtype == torch.bfloat16 and calls["calls"] == 1
    assert relative_error(out.float(), ref) <= 2e-2
