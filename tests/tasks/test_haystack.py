"""posenc.tasks.haystack: the noise haystack repeats Landmark's filler."""

from posenc.tasks.context import build_context


def _ctx(tok, hay, name, gens, target, length=1024, seed=0, **kw):
    return build_context(tok, hay[name], length, gens, seed=seed, target=target, **kw)


def test_noise_haystack_repeats_the_landmark_filler(tok, hay):
    ctx = _ctx(tok, hay, "noise", ("passkey",), 0, length=512)
    text = tok.decode(list(ctx.ids))
    assert text.count("The grass is green.") >= 5 and "pass key is" in text
