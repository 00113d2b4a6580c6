"""posenc.evals.suite.prefill on the real model (SmolLM2-135M-Instruct, bundled as GGUF) at 1k tokens: every query
kind answered from one prefill, the rewound cache equal to a fresh prefill, the target perplexity equal to a full
forward."""

import pytest
import torch

from posenc.evals.suite import prefill
from posenc.evals.suite.prefill import cache_kwarg, greedy_answer, matmul_gflops, output_cache, run_context
from posenc.tasks.context import build_context
from posenc.tasks.haystack import make_haystack


@pytest.fixture(scope="module")
def hay(smol):
    return {n: make_haystack(n, smol[1]) for n in ("book", "noise")}


def test_one_task_of_each_kind_at_1k(smol, hay):
    """Every query kind runs on the real model at 1k tokens: the pass key is found (the model reads it at its
    own length), every answer is scored, the target passage gets a finite perplexity."""
    model, tok = smol
    got = {}
    for name, gens, target in (("book", ("niah",), 128), ("noise", ("passkey",), 0), ("noise", ("mv",), 0),
                               ("noise", ("vt",), 0), ("noise", ("cwe",), 0)):
        ctx = build_context(tok, hay[name], 1024, gens, seed=0, target=target)
        r = run_context(model, tok, ctx)
        assert r["prefill_s"] > 0 and (r["peak_rss_mb"] is None or r["peak_rss_mb"] > 100) and r["gflops"] > 1
        for a in r["answers"]:
            got.setdefault(a["kind"], []).append(a)
            assert isinstance(a["correct"], bool) and 0 <= a["fraction"] <= 1 and 0 < a["distance"] <= 1024
        if target:
            assert 1 < 2.718 ** r["target"]["loss"] < 1000 and len(r["target"]["block_losses"]) == 2
    assert set(got) == {"passkey", "niah_mk", "niah_mq", "niah_mv", "vt", "cwe"}
    assert got["passkey"][0]["correct"], got["passkey"]


def test_answers_from_the_rewound_cache_equal_a_fresh_prefill(smol, hay):
    """One prefill answers all queries: rewinding the cache to the context's end before each question gives
    the tokens a separate prefill of context + question gives."""
    model, tok = smol
    ctx = build_context(tok, hay["book"], 1024, ("niah",), seed=1, target=64)
    kw = cache_kwarg(model)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ctx.ids]), use_cache=True, logits_to_keep=1)
        cache = output_cache(out)
        shared = []
        for q in ctx.queries[:3]:
            extra = cache.get_seq_length() - ctx.length
            if extra:
                cache.crop(-extra)
            shared.append(greedy_answer(model, tok, cache, q.ids, 8)[0])
        for q, text in zip(ctx.queries[:3], shared):
            fresh = output_cache(model(input_ids=torch.tensor([ctx.ids]), use_cache=True, logits_to_keep=1))
            assert greedy_answer(model, tok, fresh, q.ids, 8)[0] == text
    assert kw in ("cache", "past_key_values")


def test_target_perplexity_from_the_shared_prefill_equals_a_full_forward(smol, hay):
    model, tok = smol
    ctx = build_context(tok, hay["book"], 1024, ("niah",), seed=0, target=128)
    r = run_context(model, tok, ctx)
    ids = torch.tensor([ctx.ids])
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits[0, -129:-1]
    loss = torch.nn.functional.cross_entropy(logits, ids[0, -128:]).item()
    assert abs(loss - r["target"]["loss"]) < 1e-4


def test_the_speed_probe_is_the_best_of_its_timed_matmuls(monkeypatch):
    """``matmul_gflops``: ``2 n^3`` flops over the shortest of ``repeats`` timed products (a clock that makes the
    third the fastest)."""
    ticks = iter([0.0, 0.04, 1.0, 1.03, 2.0, 2.01, 3.0, 3.05])
    monkeypatch.setattr(prefill.time, "perf_counter", lambda: next(ticks))
    assert matmul_gflops("cpu", n=64, repeats=4) == pytest.approx(2 * 64 ** 3 / 0.01 / 1e9)
