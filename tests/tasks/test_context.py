"""posenc.tasks.context: the same needles and target tokens at every length, bad requests refused, the chat frame."""

import pytest

from posenc.tasks.context import build_context, chat_frame
from posenc.tasks.haystack import MAX_CONTEXT


def _ctx(tok, hay, name, gens, target, length=1024, seed=0, **kw):
    return build_context(tok, hay[name], length, gens, seed=seed, target=target, **kw)


def test_same_needles_and_target_tokens_at_every_length(tok, hay):
    a = _ctx(tok, hay, "book", ("niah",), 256, length=2048, seed=2)
    b = _ctx(tok, hay, "book", ("niah",), 256, length=8192, seed=2)
    assert a.ids[-256:] == b.ids[-256:]  # the scored target passage
    assert [n.text for n in a.needles] == [n.text for n in b.needles]
    assert [q.ids for q in a.queries] == [q.ids for q in b.queries]
    c = _ctx(tok, hay, "book", ("niah",), 256, length=2048, seed=3)
    assert c.ids[-256:] != a.ids[-256:]  # another seed, another passage
    # a longer context adds text in front: the haystack right before the passage is the same text
    assert a.ids[-276:-256] == b.ids[-276:-256]
    assert hay["book"].n_tokens > MAX_CONTEXT + 4 * 8192


def test_a_longer_reach_moves_every_passage_past_it_and_serves_longer_contexts(tok, hay):
    """``reach``: seed 0's passage starts that many tokens into the book, the same at every length; a context
    longer than the default 64k fits before it, and the passages are others than the default's."""
    reach = MAX_CONTEXT + 3 * 8192
    a = _ctx(tok, hay, "book", ("niah",), 128, length=2048, seed=1, reach=reach)
    b = _ctx(tok, hay, "book", ("niah",), 128, length=MAX_CONTEXT + 9000, seed=1, reach=reach)
    assert a.ids[-128:] == b.ids[-128:] and b.length == MAX_CONTEXT + 9000
    assert a.ids[-128:] == _ctx(tok, hay, "book", ("niah",), 128, length=2048, seed=4).ids[-128:]  # 3 strides on
    assert a.ids[-128:] != _ctx(tok, hay, "book", ("niah",), 128, length=2048, seed=1).ids[-128:]
    with pytest.raises(ValueError, match=f"serves contexts up to {reach} tokens"):
        _ctx(tok, hay, "book", ("niah",), 128, length=reach + 9000, reach=reach)


def test_bad_requests_are_refused(tok, hay):
    with pytest.raises(ValueError, match="too short"):
        _ctx(tok, hay, "noise", ("mv", "vt", "cwe"), 0, length=300)
    with pytest.raises(ValueError, match="generators"):
        _ctx(tok, hay, "noise", ("nope",), 0)
    with pytest.raises(ValueError, match="no target"):
        _ctx(tok, hay, "noise", ("passkey",), 64)
    with pytest.raises(ValueError, match="serves contexts up to"):
        _ctx(tok, hay, "book", ("niah",), 128, length=MAX_CONTEXT + 9000)
    with pytest.raises(ValueError, match="not used"):
        _ctx(tok, hay, "noise", ("passkey",), 0, options={"niah": {"n_keys": 2}})
    with pytest.raises(ValueError, match="depth"):
        _ctx(tok, hay, "noise", ("passkey",), 0, options={"passkey": {"depth": 1.5}})


def test_chat_frame_wraps_context_and_question(tok, hay):
    before, after = chat_frame(tok)
    assert before.endswith("<|im_start|>user\n") and after.startswith("<|im_end|>")
    ctx = _ctx(tok, hay, "noise", ("passkey",), 0, length=512, chat=True)
    assert tok.decode(list(ctx.ids)).startswith(before)
    q = tok.decode(list(ctx.queries[0].ids))
    assert "<|im_start|>assistant\n" in q and q.endswith("The pass key is")


@pytest.mark.parametrize("length", [4096, 8192, 16384])
def test_keys_sit_once_each_in_their_distance_bins_with_distinct_labels(tok, hay, length):
    """Several keys per prefill: each key's sentence occurs once, starts inside the bin it was drawn for, every
    label and value is distinct, the noise itself holds no key text, and the same bins are used at every length."""
    from posenc.tasks.ruler import bin_of, key_bins

    bins = key_bins(8192)
    ctx = _ctx(tok, hay, "noise", ("keys",), 0, length=length, seed=5, options={"keys": {"n_keys": 8, "bins": bins}})
    ctx.check(tok)  # every value occurs in the context exactly as often as in its own needle: once
    text = tok.decode(list(ctx.ids))
    labels = [n.text.split(" for ")[1].split(" is:")[0] for n in ctx.needles]
    assert len(set(labels)) == len(labels) == 8 and len({q.golds for q in ctx.queries}) == 8
    assert all(text.count(n.text.strip()) == 1 for n in ctx.needles)
    body = tok.decode(list(ctx.ids[ctx.header:]))
    assert body.count("special magic number") == 8  # the noise itself holds none (the header line names them)
    fit = [b for b in bins if b[0] < 0.8 * length]
    got = [bin_of(ctx.distance(q), bins) for q in ctx.queries]
    assert None not in got and max(got) < len(fit)  # each key in a bin that fits this length
    assert max(map(got.count, range(len(fit)))) - min(map(got.count, range(len(fit)))) <= 1  # spread evenly
    assert (2 in got) == (length > 8192)  # the far bin only past the trained length
    assert [q.kind for q in ctx.queries] == ["niah_keys"] * 8 and ctx.queries[0].chance == 1 / 8


def test_keys_are_the_same_at_every_length_and_refused_where_no_bin_fits(tok, hay):
    from posenc.tasks.ruler import bin_of, key_bins

    opts = {"keys": {"n_keys": 4, "bins": key_bins(8192)}}
    a = _ctx(tok, hay, "noise", ("keys",), 0, length=4096, seed=1, options=opts)
    b = _ctx(tok, hay, "noise", ("keys",), 0, length=16384, seed=1, options=opts)
    assert [n.text for n in a.needles] == [n.text for n in b.needles]
    # two keys per context: the rotation drawn per context reaches every bin over a few contexts
    two = {"keys": {"n_keys": 2, "bins": key_bins(8192)}}
    seen = {bin_of(c.distance(q), key_bins(8192)) for s in range(12)
            for c in [_ctx(tok, hay, "noise", ("keys",), 0, length=16384, seed=s, options=two)] for q in c.queries}
    assert seen == {0, 1, 2}
    with pytest.raises(ValueError, match="too short for every distance bin"):
        _ctx(tok, hay, "noise", ("keys",), 0, length=300, seed=1, options=opts)
