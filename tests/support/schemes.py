"""Schemes for the backend tests: every trained preset, and every inference-time method at parameters that bind at
64-256 tokens, on a RoPE model trained at 64."""

from __future__ import annotations

from posenc import PositionScheme

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
