"""posenc.models.generation: cached greedy decoding equals recompute for ragged batches; sampling options;
streaming losses equal a full forward (a bounded layer pattern too); bad arguments refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import posenc
from posenc._util import relative_error
from posenc.models.generation import StreamingSession, generate, left_padded_positions, sample_next, stream_tokens
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.scheme.core import PositionScheme, RopeSpec


def make_model(name="rope", **params):
    scheme = posenc.PositionScheme.preset(name, train_len=16, **params)
    torch.manual_seed(0)
    return posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, scheme=scheme,
                                         train_len=16)).eval()


def ragged():
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 64, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :4] = 0
    ids[0, :4] = 0
    return ids, mask


@pytest.mark.parametrize("name,params", [("rope", {}), ("alibi", {}), ("dynamic_ntk", {"factor": 2.0}),
                                         ("streaming_llm", {"window": 8, "n_sinks": 2}),
                                         ("selfextend", {"group": 4, "window": 8})])
def test_greedy_cache_equals_recompute(name, params):
    model = make_model(name, **params)
    ids, mask = ragged()
    a = generate(model, ids, 20, attention_mask=mask)
    b = generate(model, ids, 20, attention_mask=mask, use_cache=False)
    assert a.shape == (2, 30)
    assert torch.equal(a, b)
    assert torch.equal(a[:, :10], ids)


def test_chunked_prefill_same_tokens():
    model = make_model("streaming_llm", window=8, n_sinks=2)
    ids, mask = ragged()
    assert torch.equal(generate(model, ids, 12, attention_mask=mask),
                       generate(model, ids, 12, attention_mask=mask, prefill_chunk=3))


def test_row_independent_of_padding():
    model = make_model("alibi")
    ids, mask = ragged()
    both = generate(model, ids, 8, attention_mask=mask)
    alone = generate(model, ids[:1, 4:], 8)
    assert torch.equal(both[0, 10:], alone[0, 6:])


def test_sampling_seeded_and_topk1_is_greedy():
    model = make_model()
    ids, mask = ragged()
    s1 = generate(model, ids, 10, attention_mask=mask, temperature=1.0, top_p=0.9, seed=3)
    s2 = generate(model, ids, 10, attention_mask=mask, temperature=1.0, top_p=0.9, seed=3)
    assert torch.equal(s1, s2)
    greedy = generate(model, ids, 10, attention_mask=mask)
    assert torch.equal(generate(model, ids, 10, attention_mask=mask, temperature=0.7, top_k=1, seed=0), greedy)


def test_sample_next_top_p_keeps_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    draws = {int(sample_next(logits, 1.0, top_p=0.7, generator=g)) for _ in range(200)}
    assert draws == {0, 1}


def test_eos_and_stream_callback():
    model = make_model()
    ids, mask = ragged()
    greedy = generate(model, ids, 6, attention_mask=mask)
    eos = int(greedy[0, 10])  # row 0's first generated token
    seen = []
    out = generate(model, ids, 6, attention_mask=mask, eos_token_id=eos, stream=lambda t, tok: seen.append(tok))
    assert (out[0, 10:] == eos).all()
    assert len(seen) == out.shape[1] - 10 and all(s.shape == (2,) for s in seen)


def test_bad_inputs():
    model = make_model()
    ids, mask = ragged()
    with pytest.raises(ValueError, match="left padding"):
        generate(model, ids, 2, attention_mask=mask.flip(1))
    with pytest.raises(ValueError, match="max_len"):
        generate(model, ids, 20, attention_mask=mask, max_len=16)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, ids, 2, temperature=-1.0)
    with pytest.raises(ValueError, match="keeps every key"):
        StreamingSession(model)


def test_left_padded_positions():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert left_padded_positions(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]


def test_stream_tokens_losses_equal_full_forward():
    model = make_model("streaming_llm", window=8, n_sinks=2)
    g = torch.Generator().manual_seed(1)
    toks = torch.randint(0, 64, (50,), generator=g)
    losses = torch.tensor(list(stream_tokens(model, iter(toks.tolist()), chunk=7)))
    with torch.no_grad():
        logits = model(toks[None])
    ref = torch.nn.functional.cross_entropy(logits[0, :-1], toks[1:], reduction="none")
    assert torch.isnan(losses[0])
    torch.testing.assert_close(losses[1:], ref, rtol=1e-5, atol=1e-5)
    out = list(stream_tokens(model, iter(toks[:10].tolist()), chunk=4, output="logits"))
    torch.testing.assert_close(torch.stack(out), logits[0, :10], rtol=1e-5, atol=1e-5)

L = 16

PATTERNS = {"irope": {"every": 2}, "local_global": {"every": 2}, "nope_every4": {"every": 2}}


def pattern(name, **kw):
    return PositionScheme.preset(name, train_len=L, **{**PATTERNS[name], **kw})


def pattern_model(scheme, n_layers=4, seed=0, dim=32):
    torch.manual_seed(seed)
    return TinyLM(LMConfig(vocab_size=64, dim=dim, n_layers=n_layers, n_heads=4, scheme=scheme, train_len=L)).eval()


def test_a_bounded_pattern_streams():
    from posenc.models.generation import StreamingSession

    local = PositionScheme.preset("rope", train_len=L).extend("sliding_window", window=6)
    s = PositionScheme(name="all_local", train_len=L, layers=(local, replace(local, rope=RopeSpec(base=1e6))))
    m = pattern_model(s, n_layers=2)
    session = StreamingSession(m, batch_size=1)
    ids = torch.randint(0, 64, (1, 40))
    streamed = torch.cat([session.feed(ids[:, t:t + 1]) for t in range(40)], 1)
    with torch.no_grad():
        assert relative_error(streamed, m(ids)) <= 1e-5
    assert session.cache.length <= 6
    with pytest.raises(ValueError, match="keeps every key"):
        StreamingSession(pattern_model(pattern("irope")))  # its NoPE layers keep every key

P = PositionScheme


def tiny_lm(scheme=None, vocab=32, dim=16, n_layers=1, seed=0):
    torch.manual_seed(seed)
    scheme = scheme or P.preset("rope", train_len=16)
    return TinyLM(LMConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=2, scheme=scheme,
                           train_len=16)).eval()


# ------------------------------------------------------------------------------------------------ generate
@pytest.mark.parametrize("kw, match", [
    ({"max_new_tokens": 0}, r"max_new_tokens must be an integer >= 1, got 0"),
    ({"max_new_tokens": -3}, r"max_new_tokens must be an integer >= 1"),
    ({"max_new_tokens": 2.5}, r"max_new_tokens must be an integer"),
    ({"max_new_tokens": 2, "temperature": -1.0}, r"temperature must be >= 0.0"),
    ({"max_new_tokens": 2, "temperature": float("nan")}, r"temperature must be finite"),
    ({"max_new_tokens": 2, "top_k": 0}, r"top_k must be an integer >= 1"),
    ({"max_new_tokens": 2, "top_p": 0.0}, r"top_p must be > 0.0"),
    ({"max_new_tokens": 2, "prefill_chunk": 0}, r"prefill_chunk must be an integer >= 1"),
    ({"max_new_tokens": 2, "attention_mask": torch.tensor([[1, 1, 1], [0, 0, 0]])},
     r"attention_mask must be left padding"),
    ({"max_new_tokens": 2, "attention_mask": torch.tensor([[1, 2, 1], [1, 1, 1]])}, r"only 0 .* and 1"),
])
def test_generate_refuses_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny_lm(), torch.ones(2, 3, dtype=torch.long), **kw)


def test_generate_refuses_token_ids_beyond_the_vocabulary():
    with pytest.raises(ValueError, match=r"input_ids must be in \[0, vocab_size=32\)"):
        generate(tiny_lm(), torch.full((1, 3), 40), max_new_tokens=1)
