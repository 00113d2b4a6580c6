"""posenc.models.cache: prefill + token-by-token decode equals one full forward, for every scheme that generates
(the training-free methods of 2024, FoX with eviction, LongRoPE across its switch); eviction keeps bounded schemes
bounded and drops only what every layer of a pattern drops; bad input raises ValueError.

LongRoPE's short/long factor switch: keys are cached un-rotated, so decoding across
``original_max_position_embeddings`` rotates every cached key with the long factors at read time, with no
re-computation of the prefix (transformers drops its cache and re-runs the prefix at that step, see
Phi3ForCausalLM.prepare_inputs_for_generation). With one factor set per call (``dynamic="sequence"``, Hugging
Face's semantics) the first layer's step equals a full forward; deeper layers' cached keys and values were
computed from hidden states of the short-factor calls, which a full forward at the longer length recomputes with
the long factors, so only a re-run of the prefix reproduces that (a measured difference below). With posenc's
per-query schedule (``dynamic="query"``) every step equals one full forward in every layer."""

from __future__ import annotations

import pytest
import torch

import posenc
import posenc.hf
from posenc._util import relative_error
from posenc.models.cache import KVCache
from posenc.models.generation import StreamingSession, left_padded_positions
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.parts.masks import MaskSpec
from posenc.scheme.core import PositionScheme, RopeSpec
from tests.support.tiny_lm import _model, _scheme

TRAINED = ["rope", "xpos", "alibi", "t5", "kerple_power", "kerple_log", "sandwich"]

METHODS = {
    "pi": {"factor": 4.0},
    "ntk": {"factor": 4.0},
    "yarn": {"factor": 4.0},
    "dynamic_ntk": {"factor": 2.0},
    "dynamic_ntk_qwen": {},
    "dynamic_yarn": {},
    "dynamic_ntk+step": {"factor": 2.0, "step": 5},  # the schedule recomputed every 5 positions
    "rerope": {"window": 8},
    "leaky_rerope": {"window": 8, "factor": 4.0},
    "selfextend": {"group": 4, "window": 8},
    "logn": {},
    "rerope+logn": {"window": 8},
    "sliding_window": {"window": 8},
    "chunked_attention": {"chunk": 8},
    "temperature_tuning": {"floor_scale": 4.0},
    "lm_infinite": {"window": 8, "n_global": 2, "ceiling": 8},
    "streaming_llm": {"window": 8, "n_sinks": 2},
    "dca": {"chunk": 8, "local": 2},
    "yarn+dca": {"factor": 2.0, "chunk": 10, "local": 3},
}


def make_model(scheme, dim=32, n_layers=2, seed=0):
    torch.manual_seed(seed)
    return posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=dim, n_layers=n_layers, n_heads=4, scheme=scheme,
                                         train_len=16)).eval()


def scheme_for(name):
    if name in TRAINED:
        return posenc.PositionScheme.preset(name, train_len=16)
    return posenc.PositionScheme.preset(name.removesuffix("+step"), train_len=16, **METHODS[name])


def ragged_batch(total=40, short=31, seed=1):
    """Two rows, left padded: row 0 has `total` tokens, row 1 `short` tokens after padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (2, total), generator=g)
    mask = torch.ones(2, total, dtype=torch.long)
    mask[1, :total - short] = 0
    ids[1, :total - short] = 0
    return ids, mask


def full_and_decoded(model, ids, mask, prefill=12, chunk=None):
    pos = left_padded_positions(mask)
    with torch.no_grad():
        full = model(ids, positions=pos, attention_mask=mask)
        cache = KVCache.for_model(model, ids.shape[0])
        outs = []
        step = chunk or prefill
        for s in range(0, prefill, step):
            e = min(prefill, s + step)
            outs.append(model(ids[:, s:e], positions=pos[:, s:e], cache=cache, attention_mask=mask[:, s:e]))
        for t in range(prefill, ids.shape[1]):
            outs.append(model(ids[:, t:t + 1], cache=cache))  # positions continue from the cache
    return full, torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("name", TRAINED + list(METHODS))
def test_decode_equals_full_forward(name):
    model = make_model(scheme_for(name))
    ids, mask = ragged_batch()
    full, dec, _ = full_and_decoded(model, ids, mask)
    real = mask.bool()
    err = relative_error(dec[real], full[real])
    assert err <= 1e-5, f"{name}: relative error {err:.2e}"


def test_decode_padding_independent():
    """A row's logits do not depend on how much padding sits in front of it."""
    model = make_model(scheme_for("alibi"))
    ids, mask = ragged_batch()
    _, dec, _ = full_and_decoded(model, ids, mask)
    alone = ids[1:, 9:]
    _, dec1, _ = full_and_decoded(model, alone, torch.ones_like(alone), prefill=3)
    assert relative_error(dec[1, 9:], dec1[0]) <= 1e-5


@pytest.mark.parametrize("name", ["sliding_window", "streaming_llm", "lm_infinite"])
def test_bounded_cache_stays_bounded(name):
    model = make_model(scheme_for(name))
    ids, mask = ragged_batch()
    _, _, cache = full_and_decoded(model, ids, mask)
    bound = model.scheme.mask.bounded_size()
    assert cache.length <= bound - 1
    assert cache.capacity <= bound + 12  # the prefill chunk of 12 tokens
    assert cache.evicted > 0


def test_chunked_prefill_equals_full():
    model = make_model(scheme_for("streaming_llm"))
    ids, mask = ragged_batch()
    full, dec, _ = full_and_decoded(model, ids, mask, prefill=30, chunk=7)
    assert relative_error(dec[mask.bool()], full[mask.bool()]) <= 1e-5


def test_streaming_llm_matches_explicit_reindexed_construction():
    """After eviction, decoding a token equals attention over the kept keys (sinks + window) placed at
    their cache *slots* with plain RoPE (StreamingLLM's own implementation), layer by layer."""
    n_sinks, window, n = 2, 8, 30
    stream = posenc.PositionScheme.preset("streaming_llm", train_len=16, window=window, n_sinks=n_sinks)
    model = make_model(stream, n_layers=1)
    torch.manual_seed(3)
    ids = torch.randint(0, 64, (1, n))
    with torch.no_grad():
        full = model(ids)  # full forward with the streaming mask + re-indexing on original positions
        cache = KVCache.for_model(model, 1)
        dec = torch.cat([model(ids[:, t:t + 1], cache=cache) for t in range(n)], dim=1)
        assert relative_error(dec, full) <= 1e-5
        # explicit construction for the last query: kept keys = sinks + the window - 1 most recent + itself
        q_idx = n - 1
        kept = list(range(n_sinks)) + list(range(q_idx - window + 1, q_idx + 1))
        # after query n-1 the cache keeps the sinks and the window - 1 keys query n can still see
        assert cache.live_positions()[0].tolist() == list(range(n_sinks)) + list(range(n - window + 1, n))
        blk = model.blocks[0]
        x = model.pos(model.tok(ids), torch.arange(n)[None], input_ids=ids)
        h = blk.norm1(x)
        q, k, v = blk.attn.project(h)
        slots = torch.arange(len(kept))  # StreamingLLM numbers kept keys by their slot in the cache
        plain = posenc.PositionScheme.preset("rope", train_len=16)
        att = posenc.attention(q[:, :, q_idx:q_idx + 1], k[:, :, kept], v[:, :, kept], plain,
                               q_pos=slots[-1:], k_pos=slots, impl="reference")
        a = blk.attn.o_proj(att.transpose(1, 2).reshape(1, 1, -1))
        y = x[:, q_idx:q_idx + 1] + a
        y = y + blk.mlp(blk.norm2(y))
        ref = torch.nn.functional.linear(model.norm(y), model.tok.weight)
    assert relative_error(dec[:, q_idx:q_idx + 1], ref) <= 1e-5
    assert relative_error(full[:, q_idx:q_idx + 1], ref) <= 1e-5


def test_streaming_100k_tokens_bounded_memory():
    """100k tokens through a StreamingLLM session: the cache never holds more than sinks + window keys, and no step
    attends to more than sinks + window + chunk slots, so work per token is constant. No wall-clock bound: a time
    limit measures the machine's load, not the code (it failed at 40 s and 86 s on a loaded 2-core machine)."""
    n_sinks, window, chunk, total = 4, 32, 64, 100_000
    scheme = posenc.PositionScheme.preset("streaming_llm", train_len=16, window=window, n_sinks=n_sinks)
    torch.manual_seed(0)
    model = posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, scheme=scheme,
                                          train_len=16)).eval()
    session = StreamingSession(model, chunk=chunk, impl="reference")
    g = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: thread hand-off costs more than it saves on a shared machine
    try:
        _feed(session, g, total, n_sinks, window, chunk)
    finally:
        torch.set_num_threads(threads)
    assert session.tokens_seen == total
    assert int(session.cache.next_positions()[0]) == total


def _feed(session, g, total, n_sinks, window, chunk):
    fed = 0
    while fed < total:
        n = min(4096, total - fed)
        losses = session.feed_losses(torch.randint(0, 64, (n,), generator=g))
        assert torch.isfinite(losses[:, 1:] if fed == 0 else losses).all()
        fed += n
        assert session.cache.length <= n_sinks + window
        assert session.max_slots <= n_sinks + window + chunk
        assert session.cache.capacity <= n_sinks + window + chunk


# ---------------------------------------------------------------------- bad input
def test_batch_size_mismatch_raises():
    model = make_model(scheme_for("rope"))
    cache = model.new_cache(2)
    with pytest.raises(ValueError, match="batch size"):
        model(torch.zeros(3, 4, dtype=torch.long), cache=cache)


def test_cache_reused_across_models_raises():
    a, b = make_model(scheme_for("rope")), make_model(scheme_for("rope"), seed=1)
    cache = KVCache.for_model(a, 1)
    a(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="another model"):
        b(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    c = make_model(scheme_for("alibi"))
    with pytest.raises(ValueError, match="another model"):
        c(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_max_len_too_small_raises():
    model = make_model(scheme_for("rope"))
    cache = KVCache.for_model(model, 1, max_len=8)
    with torch.no_grad():
        model(torch.zeros(1, 6, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="max_len"):
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    bounded = make_model(scheme_for("sliding_window"))
    with pytest.raises(ValueError, match="max_len"):
        KVCache.for_model(bounded, 1, max_len=4)
    cache = KVCache.for_model(bounded, 1, max_len=8)
    with torch.no_grad():
        for _ in range(20):  # decoding never needs more than the window
            bounded(torch.zeros(1, 1, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="max_len"):
            bounded(torch.zeros(1, 9, dtype=torch.long), cache=cache)


def test_memory_schemes_refuse_a_cache():
    model = make_model(posenc.PositionScheme.preset("infini", train_len=16))
    with pytest.raises(ValueError, match="use_cache=False"):
        KVCache.for_model(model, 1)


def test_cache_grows_by_doubling():
    model = make_model(scheme_for("rope"))
    cache = KVCache.for_model(model, 1)
    caps = set()
    with torch.no_grad():
        for _ in range(200):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
            caps.add(cache.capacity)
    assert sorted(caps) == [16, 32, 64, 128, 256]  # sized to use, then doubling
    assert cache.length == 200 and int(cache.next_positions()[0]) == 200

L = 16

PATTERNS = {"irope": {"every": 2}, "local_global": {"every": 2}, "nope_every4": {"every": 2}}


def pattern(name, **kw):
    return PositionScheme.preset(name, train_len=L, **{**PATTERNS[name], **kw})


def pattern_model(scheme, n_layers=4, seed=0, dim=32):
    torch.manual_seed(seed)
    return TinyLM(LMConfig(vocab_size=64, dim=dim, n_layers=n_layers, n_heads=4, scheme=scheme, train_len=L)).eval()


def test_the_cache_evicts_only_what_every_layer_drops():
    chunked = PositionScheme(name="all_chunked", train_len=L, layers=(
        PositionScheme.preset("rope", train_len=L).extend("chunked_attention", chunk=5),))
    m = pattern_model(chunked, n_layers=2)
    assert KVCache.for_model(m, 1).mask == MaskSpec(chunk=5)
    assert KVCache.for_model(pattern_model(pattern("irope")), 1).mask == MaskSpec()  # its NoPE layers see every key

HEAD_DIM = 8


def longrope_scheme(dynamic: str) -> posenc.PositionScheme:
    g = torch.Generator().manual_seed(0)
    short = (1.0 + torch.rand(HEAD_DIM // 2, generator=g)).tolist()
    long = (2.0 + 6.0 * torch.rand(HEAD_DIM // 2, generator=g)).tolist()
    scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long, "factor": 4.0,
               "original_max_position_embeddings": L}
    return posenc.PositionScheme(name="longrope", rope=RopeSpec(scaling=scaling, dynamic=dynamic), train_len=L)


def _longrope_model(dynamic, n_layers=2):
    torch.manual_seed(0)
    return posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=32, n_layers=n_layers, n_heads=4,
                                         scheme=longrope_scheme(dynamic), train_len=L)).eval()


def _decode(model, ids, prefill):
    cache = KVCache.for_model(model, ids.shape[0])
    outs = [model(ids[:, :prefill], cache=cache)]
    outs += [model(ids[:, t:t + 1], cache=cache) for t in range(prefill, ids.shape[1])]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("prefill", [10, L, L + 1])
def test_decode_across_the_boundary_equals_each_steps_full_forward(prefill):
    """Hugging Face's semantics (``dynamic="sequence"``: one factor set per call, chosen by its length), one
    layer: the output at step t equals the last row of a full forward over the first t + 1 tokens, short
    factors up to L tokens and long factors beyond, for every cached key."""
    model = _longrope_model("sequence", n_layers=1)
    ids = torch.randint(0, 64, (2, 2 * L + 3), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        dec = _decode(model, ids, prefill)
        for t in range(prefill - 1, ids.shape[1]):
            full = model(ids[:, :t + 1])
            assert relative_error(dec[:, t], full[:, t]) <= 1e-5, t
            if t == prefill - 1:  # the prefill's rows are one full forward
                assert relative_error(dec[:, :prefill], full) <= 1e-5


def test_the_long_factors_reach_the_cached_keys():
    """Crossing the boundary changes the rotation of keys cached before it (a cache of rotated keys would
    keep the short-factor ones): the step after the boundary differs from what short factors give."""
    model = _longrope_model("sequence")
    ids = torch.randint(0, 64, (1, L + 1), generator=torch.Generator().manual_seed(2))
    short = longrope_scheme("sequence")
    scaling = dict(short.rope.scaling, long_factor=short.rope.scaling["short_factor"])
    model_short = posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, train_len=L,
                                                scheme=posenc.PositionScheme(
                                                    name="short", rope=RopeSpec(scaling=scaling, dynamic="sequence"),
                                                    train_len=L)))
    model_short.load_state_dict(model.state_dict())
    with torch.no_grad():
        a, b = _decode(model, ids, L), _decode(model_short.eval(), ids, L)
    assert relative_error(a[:, :L], b[:, :L]) <= 1e-6  # up to L tokens: the short factors in both
    # the step across: long factors for every key (7.5e-4 on these weights, 750x the equality bound above)
    assert relative_error(a[:, L], b[:, L]) > 1e-4


def test_deeper_layers_need_the_prefix_recomputed():
    """Two layers, one factor set per call: up to L tokens and at every step the first layer agrees, but
    the step across the boundary differs from the full forward through the second layer's cached values
    (computed from short-factor hidden states); what transformers' re-run of the prefix fixes."""
    model = _longrope_model("sequence", n_layers=2)
    ids = torch.randint(0, 64, (1, L + 2), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        dec = _decode(model, ids, 8)
        before = model(ids[:, :L])
        after = model(ids[:, :L + 1])
    assert relative_error(dec[:, :L], before) <= 1e-5
    assert relative_error(dec[:, L], after[:, L]) > 1e-5


def test_per_query_schedule_equals_one_full_forward():
    """posenc's default ``dynamic="query"``: query m uses the factors of length m + 1, so one full forward
    equals decoding across the boundary at every position."""
    model = _longrope_model("query")
    ids = torch.randint(0, 64, (2, 2 * L + 3), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids)
        dec = _decode(model, ids, 5)
    assert relative_error(dec, full) <= 1e-5


# ============================================================================ cached decoding


def _full_and_decoded(model, prefill=12, total=40, short=31):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, total), generator=g)
    mask = torch.ones(2, total, dtype=torch.long)
    mask[1, :total - short] = 0
    pos = left_padded_positions(mask)
    with torch.no_grad():
        full = model(ids, positions=pos, attention_mask=mask)
        cache = KVCache.for_model(model, 2)
        outs = [model(ids[:, :prefill], positions=pos[:, :prefill], cache=cache, attention_mask=mask[:, :prefill])]
        outs += [model(ids[:, t:t + 1], cache=cache) for t in range(prefill, total)]
    return full[mask.bool()], torch.cat(outs, dim=1)[mask.bool()], cache


def test_fox_decode_with_eviction_keeps_the_evicted_gates():
    """With a sliding window (and left padding in one row) the cache evicts keys and compacts the survivors;
    each key's cumulative gate c_j moves with it and each row's running c continues, so decoding equals the
    full forward and the cache stays bounded."""
    model = _model(_scheme("fox").extend("sliding_window", window=6))
    full, dec, cache = _full_and_decoded(model)
    assert relative_error(dec, full) <= 1e-5
    assert cache.evicted > 0 and cache.length <= model.scheme.mask.bounded_size()
    assert len(cache.gate) == 2 and cache.gate[0].shape[:2] == (2, 4)


def test_fox_cache_refuses_a_mismatched_gate_chunk():
    model = _model(_scheme("fox"))
    cache = KVCache.for_model(model, 1)
    plain = KVCache.for_model(_model(_scheme("alibi")), 1)
    with pytest.raises(ValueError, match="keeps no forget gates"):
        plain.update_gate(0, torch.zeros(1, 4, 1))
    k = torch.zeros(1, 4, 3, 8)
    cache.update(0, k, k, torch.arange(3)[None], None)
    with pytest.raises(ValueError, match="log_f must be"):
        cache.update_gate(0, torch.zeros(1, 4, 2))


# ============================================================================ every backend, cache, transformers
NEW = [("string", dict(shift=20, local=5, attention_factor=1.07)), ("resonance+yarn", dict(factor=4.0)),
       ("retrieval", dict(window=16, n_sinks=2, block=8, top_k=2)), ("retrieval", dict(window=9, block=3,
                                                                                       top_k=3, per_head=True)),
       ("duo", dict(streaming=[0, 2], n_sinks=2, window=10)), ("dca", dict(chunk=40, local=8, temperature="qwen")),
       ("dca", dict(chunk=40, local=8, temperature="chunkllama", temperature_length="sequence"))]


@pytest.mark.parametrize("spec, kw", NEW[:6] + [("duo", dict(streaming=[[1], [0, 3]], n_sinks=1, window=6))])
def test_cached_decode_equals_full_forward(spec, kw):
    torch.manual_seed(0)
    scheme = PositionScheme.preset(spec, train_len=16, **{**kw, **({"window": 6} if "window" in kw else {})})
    model = posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, train_len=16,
                                          scheme=scheme)).eval()
    ids = torch.randint(0, 64, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache.for_model(model, 2)
        outs = [model(ids[:, :7], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(7, 50)]
    assert relative_error(torch.cat(outs, dim=1), full) <= 1e-5

P = PositionScheme


def tiny_lm(scheme=None, vocab=32, dim=16, n_layers=1, seed=0):
    torch.manual_seed(seed)
    scheme = scheme or P.preset("rope", train_len=16)
    return TinyLM(LMConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=2, scheme=scheme,
                           train_len=16)).eval()


# ------------------------------------------------------------------------------------------------ KV cache
@pytest.mark.parametrize("first, second, match", [
    ([0, 1, 2], [2, 3], r"row 0 got position 2 after position 2"),  # repeats
    ([0, 1, 2], [1], r"row 0 got position 1 after position 2"),  # goes backwards
    ([0, 1, 2], [4, 4], r"row 0 got position 4 after position 4"),  # repeats inside the chunk
    ([3, 1, 2], None, r"row 0 got position 1 after position 3"),  # backwards inside the first chunk
])
def test_cache_refuses_positions_that_go_backwards_or_repeat(first, second, match):
    model = tiny_lm()
    cache = model.new_cache(1)
    with torch.no_grad():
        if second is None:
            with pytest.raises(ValueError, match=match):
                model(torch.ones(1, len(first), dtype=torch.long), positions=torch.tensor([first]), cache=cache)
            assert cache.length == 0  # nothing committed
            return
        model(torch.ones(1, len(first), dtype=torch.long), positions=torch.tensor([first]), cache=cache)
        with pytest.raises(ValueError, match=match):
            model(torch.ones(1, len(second), dtype=torch.long), positions=torch.tensor([second]), cache=cache)
        assert cache.length == len(first) and int(cache.next_positions()[0]) == first[-1] + 1
        out = model(torch.ones(1, 1, dtype=torch.long), cache=cache)  # the cache still works
    assert out.shape == (1, 1, 32)


def test_cache_accepts_gaps_and_ignores_padding_positions():
    model = tiny_lm()
    cache = model.new_cache(2)
    ids = torch.ones(2, 3, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1], [0, 0, 1]])
    pos = torch.tensor([[0, 1, 2], [0, 0, 0]])  # padding positions repeat: they are not keys
    with torch.no_grad():
        model(ids, positions=pos, cache=cache, attention_mask=mask)
        model(torch.ones(2, 1, dtype=torch.long), positions=torch.tensor([[10], [5]]), cache=cache)
    assert cache.next_positions().tolist() == [11, 6]


@pytest.mark.parametrize("window", [10**6, 2**40])
def test_cache_allocates_what_is_used_not_the_window(window):
    model = tiny_lm(P.preset("sliding_window", train_len=16, window=window), n_layers=2)
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.ones(1, 5, dtype=torch.long), cache=cache)
    assert cache.capacity == 16  # the minimum first allocation, not window + 1
    assert cache.nbytes() < 10_000
    with torch.no_grad():
        for _ in range(20):
            model(torch.ones(1, 1, dtype=torch.long), cache=cache)
    assert cache.capacity == 32 and cache.length == 25  # grown by doubling


def test_cache_refuses_a_bad_initial_capacity():
    model = tiny_lm()
    with pytest.raises(ValueError, match=r"initial_capacity must be an integer >= 1"):
        KVCache(1, 1, 2, 8, model.scheme.mask, initial_capacity=0)
