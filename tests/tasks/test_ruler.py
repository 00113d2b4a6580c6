"""posenc.tasks.ruler: the long-context suite's task generators under the real model's tokenizer (SmolLM2's BPE).

Every answer is re-derived from the context's decoded text alone (a parser independent of the generators), the
answer sits in the context exactly where the needle was placed and nowhere else, the distractors are distinct,
and the chance levels are the content-copy baselines."""

import math
import random
import re
from collections import Counter

import pytest

from posenc.tasks.context import build_context
from posenc.tasks.ruler import GENERATORS, KeyPool

CONTEXTS = [("book", ("niah",), 128), ("noise", ("passkey",), 0), ("noise", ("mv",), 0), ("noise", ("vt",), 0),
            ("noise", ("cwe",), 0), ("noise", ("mv", "vt", "cwe"), 0)]


def _ctx(tok, hay, name, gens, target, length=1024, seed=0, **kw):
    return build_context(tok, hay[name], length, gens, seed=seed, target=target, **kw)


# --------------------------------------------------------------- answers re-derived from the text alone
def _derive(text: str, question: str) -> set[str]:
    """What a careful reader of ``text`` answers to ``question`` (the decoded query: question and answer prefix):
    parsed from the sentences, not the generators."""
    question = question.strip()
    magic: dict[str, list[str]] = {}
    for key, value in re.findall(r"special magic numbers for ([a-z]+-[a-z]+) is: (\d+)\.", text):
        magic.setdefault(key, []).append(value)
    if question.startswith("What is the pass key?"):
        return set(re.findall(r"The pass key is (\d+)\. Remember it\. \1 is the pass key\.", text))
    if m := re.match(r"What (?:is|are all) the special magic numbers? for ([a-z]+-[a-z]+) ", question):
        return set(magic[m.group(1)])
    if m := re.match(r"What are the special magic numbers for ([a-z]+-[a-z]+) and ([a-z]+-[a-z]+) ", question):
        return set(magic[m.group(1)] + magic[m.group(2)])
    if m := re.match(r"Find all variables that are assigned the value (\d+) ", question):
        holds = {m.group(1)}
        edges = re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d+)\.", text)
        names: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, src in edges:
                if name not in names and src.removeprefix("VAR ") in holds | names:
                    names.add(name)
                    changed = True
        return names
    if m := re.match(r"Which (\d+) words were most often", question):
        counts = Counter(re.findall(r"The word of the day is ([a-z]+)\.", text))
        ranked = counts.most_common()
        k = int(m.group(1))
        assert ranked[k - 1][1] > ranked[k][1], "the frequent words must be unambiguous"
        return {w for w, _ in ranked[:k]}
    raise AssertionError(f"no parser for {question!r}")


@pytest.mark.parametrize("name,gens,target", CONTEXTS, ids=["+".join(c[1]) for c in CONTEXTS])
def test_every_gold_answer_follows_from_the_text_alone(tok, hay, name, gens, target):
    for seed in range(3):
        ctx = _ctx(tok, hay, name, gens, target, length=2048, seed=seed)
        ctx.check(tok)
        text = tok.decode(list(ctx.ids))
        assert ctx.queries
        for q in ctx.queries:
            question = tok.decode(list(q.ids))
            assert _derive(text, question) == set(q.golds), (q.kind, question)


@pytest.mark.parametrize("name,gens,target", CONTEXTS, ids=["+".join(c[1]) for c in CONTEXTS])
def test_needles_at_their_depths_exact_length_and_distinct_distractors(tok, hay, name, gens, target):
    ctx = _ctx(tok, hay, name, gens, target, length=4096, seed=1)
    assert len(ctx.ids) == 4096 and ctx.length == 4096
    rng = random.Random(f"{name}/1")
    pool = KeyPool(rng)
    wanted = [n for g in gens for n in GENERATORS[g](rng, pool)[0]]  # the generators' own draws, replayed
    assert [n.text for n in ctx.needles] == [w.text for w in wanted]
    assert ctx.header + ctx.haystack_tokens + sum(n.end - n.start for n in ctx.needles) + target == 4096
    longest_piece = max(len(p) for p in hay[name].pieces[:5000])
    for placed, want in zip(ctx.needles, wanted):
        assert tok.decode(list(ctx.ids[placed.start:placed.end])).strip() == want.text.strip()
        # among the haystack tokens, the needle sits at the piece border nearest to its depth
        needles_before = sum(n.end - n.start for n in ctx.needles if n.start < placed.start)
        offset = placed.start - ctx.header - needles_before
        assert abs(offset - want.depth * ctx.haystack_tokens) <= longest_piece, (placed, want)
    texts = [n.text for n in ctx.needles]
    if "cwe" not in gens:
        assert len(set(texts)) == len(texts)  # every needle is its own sentence
    golds = [g for q in ctx.queries if q.kind in ("niah_mk", "passkey", "niah_mv") for g in q.golds]
    assert len(set(golds)) == len(golds)  # no value answers two questions


def test_vt_links_keep_their_order(tok, hay):
    ctx = _ctx(tok, hay, "noise", ("vt",), 0, length=2048, seed=3)
    for q in ctx.queries:
        starts = [ctx.needles[i].start for i in q.needles]
        assert starts == sorted(starts)


def test_passkey_depth_option_places_the_key(tok, hay):
    for depth in (0.1, 0.5, 0.9):
        ctx = _ctx(tok, hay, "noise", ("passkey",), 0, length=2048, options={"passkey": {"depth": depth}})
        assert abs(ctx.needles[0].start / 2048 - depth) < 0.03


def test_chance_levels_are_the_content_copy_baselines(tok, hay):
    got = {q.kind: q.chance for g in ("niah", "mv", "passkey", "vt", "cwe")
           for q in _ctx(tok, hay, "book" if g == "niah" else "noise", (g,), 128 if g == "niah" else 0).queries}
    assert got["niah_mk"] == 1 / 4 and got["niah_mq"] == 1 / 6  # one / a pair of the four numbers
    assert got["niah_mv"] == 1 / math.comb(8, 4)  # four of the eight numbers of two keys
    assert got["vt"] == 1 / math.comb(10, 5) and got["cwe"] == 1 / math.comb(9, 3)
    assert got["passkey"] == 0.0
