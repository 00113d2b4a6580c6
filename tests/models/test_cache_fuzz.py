"""Differential fuzzing of cached decoding: a prefill plus token-by-token decoding through
:class:`posenc.models.cache.KVCache` gives the logits of one full forward over the same tokens, on random
schemes (every trained preset that can hold a KV cache, inference-time methods and ``+`` compositions
with parameters anywhere in their valid ranges, soft-caps), random prompt lengths and prefill splits
(sometimes chunked), GQA, and a batch of 2 ragged rows (the second left padded, sometimes down to a
single real token). Profiles and scheme strategies: ``tests/support/fuzz.py``.

Tolerance: ``relative_error`` (max |a - e| / max |e|) of the real tokens' logits <= 1e-5 in fp32. The
full forward and the decode steps run different engine paths (a fused kernel or the tiled path over
the whole sequence, the materialised path for one query) through 2 layers, so the logits differ by the
summation order of each path (a few fp32 ulps per layer, amplified by the logit magnitudes of at most
~50 that these models produce); a stale position, a missed mask, a wrongly evicted key or a key rotated
at the wrong slot changes logits at the 1e-2..1 level.
"""

from __future__ import annotations

import torch
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

import posenc
from posenc._util import relative_error
from tests.models.test_cache import full_and_decoded
from tests.support.fuzz import FUZZ, examples, schemes

TOL = 1e-5
MAX_LEN = 160 if FUZZ else 64
BASES = ("rope", "xpos", "alibi", "kerple_power", "kerple_log", "sandwich", "t5", "nope", "sinusoidal",
         "learned", "hierarchical", "floater", "complex_order", "shaw", "transformer_xl", "deberta")


@st.composite
def decode_cases(draw):
    n_kv = draw(st.integers(1, 2))
    n_heads = n_kv * draw(st.integers(1, 2))
    head_dim = draw(st.sampled_from([8, 16]))
    drawn = draw(schemes(head_dim, bases=BASES, train_len=st.integers(4, 128)))
    total = draw(st.integers(1, MAX_LEN))
    max_pos = drawn.scheme.max_positions
    assume(max_pos is None or max_pos >= total)  # a learned table cannot address longer sequences
    pad = draw(st.sampled_from([0, total - 1]) | st.integers(0, total - 1))
    prefill = draw(st.integers(max(1, pad), total))  # decode steps carry real tokens only (as in generate)
    chunk = draw(st.none() | st.integers(1, prefill))
    return drawn, n_heads, n_kv, head_dim, total, pad, prefill, chunk, draw(st.integers(0, 2 ** 16))


def _model(scheme, n_heads, n_kv, head_dim, seed):
    torch.manual_seed(seed)
    cfg = posenc.LMConfig(vocab_size=64, dim=n_heads * head_dim, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv,
                          scheme=scheme, train_len=scheme.train_len or 16)
    return posenc.TinyLM(cfg).eval()


def _full_and_decoded(model, ids, mask, prefill, chunk):
    full, decoded, _ = full_and_decoded(model, ids, mask, prefill=prefill, chunk=chunk)
    return full, decoded


@settings(max_examples=examples(ci=15, fuzz=1500))
@given(case=decode_cases())
def test_cached_decode_equals_full_forward(case):
    drawn, n_heads, n_kv, head_dim, total, pad, prefill, chunk, seed = case
    model = _model(drawn.scheme, n_heads, n_kv, head_dim, seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (2, total), generator=g)
    mask = torch.ones(2, total, dtype=torch.long)
    mask[1, :pad] = 0
    ids[1, :pad] = 0
    full, dec = _full_and_decoded(model, ids, mask, prefill, chunk)
    real = mask.bool()
    assert torch.isfinite(full[real]).all() and torch.isfinite(dec[real]).all()
    err = relative_error(dec[real], full[real])
    note(f"relative error {err:.2e}")
    assert err <= TOL, f"cached decode vs full forward: relative error {err:.3e} > {TOL:.0e}"
