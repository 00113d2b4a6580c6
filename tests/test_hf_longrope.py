"""LongRoPE through ``posenc.hf.extend``: transformers' own (the default, what a saved config serves) chooses
``short_factor`` or ``long_factor`` by the length of the sequence it is given, so a prompt of at most the original
length that grows past it while decoding gets its new tokens rotated with the long factors against keys cached
with the short ones (the SmolLM2 suite's 8k pass keys, docs/results/smollm2.md). With ``native=False`` posenc's
engine runs it as a dynamic schedule (query ``m`` uses the factors of length ``m + 1``, keys re-rotated with them):
cached decoding equals the full forward across the switch."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from posenc.hf.patch import extend

L = 64
PARAMS = {"factor": 2.0, "short_factor": [1.0] * 8, "long_factor": [1.0, 1.1, 1.2, 1.4, 1.6, 1.8, 2.0, 2.0]}


def _model(layers: int):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                   max_position_embeddings=L)
    return transformers.LlamaForCausalLM(cfg).eval()


@torch.no_grad()
def _cached_minus_full(model, ids, prefill: int) -> float:
    """max |logits of cached decoding after a ``prefill``-token prompt - the full forward's|."""
    full = model(ids).logits[0, prefill:]
    cache = model(ids[:, :prefill], use_cache=True).past_key_values
    steps = []
    for t in range(prefill, ids.shape[1]):
        out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        steps.append(out.logits[0, -1])
    return float((torch.stack(steps) - full).abs().max())


@pytest.mark.parametrize("step", [1, 16, L])
def test_engine_longrope_decodes_across_the_original_length_like_the_full_forward(step):
    base = _model(2)
    ids = torch.randint(0, 100, (1, L + 8), generator=torch.Generator().manual_seed(1))
    engine = extend(copy.deepcopy(base), "longrope", native=False, step=step, **PARAMS)
    assert _cached_minus_full(engine, ids, L) < 1e-5  # a prompt of exactly L tokens, decoding past it
    assert _cached_minus_full(engine, ids, L - 3) < 1e-5


def test_transformers_longrope_cache_breaks_across_the_original_length():
    """The behaviour the engine path avoids (if transformers re-rotates its cache one day, this fails: then the
    SmolLM2 page's explanation of the 8k failure is out of date)."""
    base = _model(2)
    ids = torch.randint(0, 100, (1, L + 8), generator=torch.Generator().manual_seed(1))
    native = extend(copy.deepcopy(base), "longrope", **PARAMS)
    assert _cached_minus_full(native, ids, L) > 1e-4
    beyond = torch.randint(0, 100, (1, 2 * L), generator=torch.Generator().manual_seed(2))
    assert _cached_minus_full(native, beyond, L + 8) < 1e-5  # a prompt already past L: one schedule throughout


@torch.no_grad()
def test_engine_longrope_past_the_original_length_is_transformers_longrope():
    """One layer (nothing earlier positions computed differently flows in): every query beyond L sees the long
    factors on itself and on every key, as transformers' forward of the whole sequence does; queries up to L see
    the short factors, as transformers' forward of those L tokens does."""
    base = _model(1)
    ids = torch.randint(0, 100, (1, 2 * L), generator=torch.Generator().manual_seed(3))
    native = extend(copy.deepcopy(base), "longrope", **PARAMS)
    engine = extend(copy.deepcopy(base), "longrope", native=False, step=1, **PARAMS)
    got = engine(ids).logits[0]
    torch.testing.assert_close(got[L:], native(ids).logits[0, L:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[:L], native(ids[:, :L]).logits[0], atol=1e-5, rtol=1e-5)
