"""``blockwise``: equals the materialised reference on every preset."""

import pytest
import torch

from posenc import PositionalAttention, PositionScheme
from posenc._util import relative_error

torch.manual_seed(0)


# ------------------------------------------------------------------ fast paths == reference for every preset
TRAINED = list(PositionScheme.presets())

_INFERENCE_PARAMS = {
    "pi": {"factor": 4}, "ntk": {"factor": 4}, "ntk_mixed": {"factor": 4}, "yarn": {"factor": 4},
    "llama3": {"factor": 4}, "rope_base": {"base": 500.0}, "rerope": {"window": 40},
    "leaky_rerope": {"window": 40, "factor": 4}, "selfextend": {"group": 4, "window": 40},
    "sliding_window": {"window": 50}, "lm_infinite": {"window": 50}, "streaming_llm": {"window": 50},
    "bca": {}, "pcw": {"window": 64}, "logn": {}, "dynamic_ntk": {}, "dynamic_ntk_qwen": {},
    "dynamic_yarn": {}, "dca": {"chunk": 40, "local": 8}, "p_rope": {}, "chunked_attention": {"chunk": 48},
    "temperature_tuning": {"floor_scale": 16.0}, "string": {"shift": 40, "local": 8}, "resonance": {},
    "retrieval": {"window": 32, "n_sinks": 2, "block": 8, "top_k": 2}, "duo": {"streaming": [1, 3], "window": 20},
}


def _preset(name):
    from posenc.scheme.core import METHODS, TRAINED

    if name in METHODS and name not in TRAINED:
        return PositionScheme.preset(name, train_len=64, **_INFERENCE_PARAMS[name])
    return PositionScheme.preset(name, train_len=64)


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
