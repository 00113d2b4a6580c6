"""posenc.parts.frequencies.longrope: ``longrope`` equals Hugging Face's (whole tensors, attention variants), and
LongRoPE through ``posenc.hf.extend``.

transformers' own LongRoPE (the default, what a saved config serves) chooses ``short_factor`` or ``long_factor`` by
the length of the sequence it is given, so a prompt of at most the original length that grows past it while
decoding gets its new tokens rotated with the long factors against keys cached with the short ones (the SmolLM2
suite's 8k pass keys, docs/results/smollm2.md). With ``native=False`` posenc's engine runs it as a dynamic
schedule (query ``m`` uses the factors of length ``m + 1``, keys re-rotated with them): cached decoding equals the
full forward across the switch."""

from __future__ import annotations

import copy

import pytest
import torch

from posenc.hf.patch import extend
from tests.support.hf_rope import GRID, TRAINED, _check_equal_hf

transformers = pytest.importorskip("transformers")



transformers.logging.set_verbosity_error()  # HF warns about the configs we deliberately stretch


def _longrope_lists(n: int, seed: int) -> tuple[list[float], list[float]]:
    g = torch.Generator().manual_seed(seed)
    short = (1.0 + 0.2 * torch.rand(n, generator=g, dtype=torch.float64)).tolist()
    long = (1.0 + 20.0 * torch.rand(n, generator=g, dtype=torch.float64).cumsum(0) / n).tolist()
    return short, long


@pytest.mark.parametrize("head_dim,base,factor,prf", GRID)
@pytest.mark.parametrize("seq_len", [TRAINED // 2, TRAINED, TRAINED + 1, 8 * TRAINED])
def test_longrope_equals_hf(head_dim, base, factor, prf, seq_len):
    short, long = _longrope_lists(int(head_dim * prf) // 2, seed=head_dim)
    extra = {"factor": factor, "short_factor": short, "long_factor": long,
             "original_max_position_embeddings": TRAINED}
    _check_equal_hf("longrope", head_dim, base, prf, extra, seq_len=seq_len, max_pos=int(TRAINED * factor))


@pytest.mark.parametrize("variant", [{"attention_factor": 1.3}, {"factor": None}])
def test_longrope_attention_variants_equal_hf(variant):
    short, long = _longrope_lists(32, seed=0)
    extra = {"short_factor": short, "long_factor": long, "original_max_position_embeddings": 4096, **variant}
    # Phi-3 style: no factor, HF infers it from max_position_embeddings / original (here 32)
    _check_equal_hf("longrope", 64, 10000.0, 1.0, extra, seq_len=5000, max_pos=131072,
                    ours_extra={"max_position_embeddings": 131072})

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
