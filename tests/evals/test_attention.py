"""Where the answer looks (posenc.analysis.attention, posenc.evals.attention): the recorded weights are the model's
own (transformers' eager attention weights on the untouched model), the regions partition the keys, a remap's
far keys are the ``remapped`` share, and a model whose layers do not run on the engine is refused."""

from __future__ import annotations

import pytest
import torch
import transformers

from posenc.analysis.attention import REGIONS, WeightRow, record_last_query, region_mass
from posenc.evals.attention import answer_attention, question_regions
from posenc.hf import extend
from posenc.tasks.context import build_context
from posenc.tasks.haystack import make_haystack

L = 256


@pytest.fixture(scope="module")
def tok():
    from posenc.hf.export import byte_tokenizer

    return byte_tokenizer()


def _model(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=260, max_position_embeddings=L)
    cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def ctx(tok):
    hay = make_haystack("noise", tok)
    return build_context(tok, hay, 600, ("keys",), seed=3, options={"keys": {"n_keys": 2, "bins": ((40, 200),
                                                                                                  (250, 500))}})


def test_the_recorded_weights_are_transformers_eager_attention_weights(ctx, tok):
    """On the untouched model's identity path, the needle / other-needles / start masses of every layer and head
    equal the sums of transformers' own eager attention weights (output_attentions) of the question's last token
    over the same spans, and the regions sum to 1 per head."""
    plain = _model()
    engine = extend(_model(), "none", native=False)
    q = ctx.queries[0]
    ids = torch.tensor([list(ctx.ids) + list(q.ids)])
    with torch.no_grad():
        eager = plain(input_ids=ids, output_attentions=True).attentions  # per layer [1,H,N,N]
    got = answer_attention(engine, tok, ctx)[0]
    regions = question_regions(ctx, q, ids.shape[1], 4, tok)
    for layer, att in enumerate(eager):
        row = att[0, :, -1]  # [H,N]
        for name in REGIONS:
            want = row[:, regions[name]].sum(-1)
            torch.testing.assert_close(got.mass[name][layer], want, atol=2e-5, rtol=0)
        total = sum(got.mass[name][layer] for name in REGIONS)
        torch.testing.assert_close(total, torch.ones_like(total), atol=1e-5, rtol=0)
    assert float(got.mass["remapped"].abs().max()) == 0.0  # the identity reads every key at its distance
    assert got.distance == ctx.distance(q) and isinstance(got.correct, bool)


def test_a_remaps_far_keys_are_its_remapped_share(ctx):
    """ReRoPE with window w reads every key w or more back at w: the ``remapped`` mass is the weight on those more
    than w back (hand-checked from the recorded row and the keys' distances), and ``beyond`` the weight on keys a
    trained length or more back."""
    w = 64
    model = extend(_model(), "rerope", native=False, window=w)
    rows: list[WeightRow] = []
    q = ctx.queries[1]
    with torch.no_grad(), record_last_query(rows):
        model(input_ids=torch.tensor([list(ctx.ids) + list(q.ids)]))
    assert len(rows) == 3
    for row in rows:
        far = (row.q_pos - row.k_pos) > w  # the key w back is read at its own distance
        m = region_mass(row, {"all": torch.ones(row.k_pos.numel(), dtype=torch.bool)}, train_len=L)
        torch.testing.assert_close(m["remapped"], row.weights[:, far].sum(-1))
        torch.testing.assert_close(m["beyond"], row.weights[:, (row.q_pos - row.k_pos) >= L].sum(-1))
        assert float(m["remapped"].min()) > 0
        torch.testing.assert_close(m["all"], torch.ones(4), atol=1e-5, rtol=0)


def test_region_mass_by_hand():
    """Two heads over five keys at positions 0-4 from a query at 4 (distances 4, 3, 2, 1, 0), read at 1, 1, 1, 1, 0
    (a remap that reads every key past the first at 1): regions sum their weights; ``remapped`` holds keys 0-2."""
    w = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.0], [0.5, 0.0, 0.0, 0.25, 0.25]])
    row = WeightRow(w, torch.arange(5), 4, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64))
    regions = {"a": torch.tensor([True, False, False, False, False]), "b": torch.tensor([False, True, True])}
    m = region_mass(row, regions, train_len=3)
    torch.testing.assert_close(m["a"], torch.tensor([0.1, 0.5]))
    torch.testing.assert_close(m["b"], torch.tensor([0.5, 0.0]))  # key 3, 4 lie past the region's positions
    torch.testing.assert_close(m["remapped"], torch.tensor([0.6, 0.5]))
    torch.testing.assert_close(m["beyond"], torch.tensor([0.3, 0.5]))  # distances 4 and 3


def test_a_model_off_the_engine_is_refused_naming_native(ctx, tok):
    with pytest.raises(ValueError, match="native=False"):
        answer_attention(_model(), tok, ctx)


def test_the_question_regions_partition_the_positions(ctx, tok):
    q = ctx.queries[0]
    n = ctx.length + len(q.ids)
    regions = question_regions(ctx, q, n, 4, tok)
    stacked = torch.stack([regions[r] for r in REGIONS]).long().sum(0)
    assert bool((stacked == 1).all())
    needle = ctx.needles[q.needles[0]]
    both = regions["needle"] | regions["answer"]
    assert bool(both[needle.start:needle.end].all()) and int(both.sum()) == needle.end - needle.start
    spelled = tok.decode([ctx.ids[i] for i in regions["answer"].nonzero().flatten().tolist()])
    assert spelled == q.golds[0]  # the byte tokenizer: the value's digits exactly
    without = question_regions(ctx, q, n, 4)  # no tokenizer: the whole needle
    assert not bool(without["answer"].any()) and bool(torch.equal(without["needle"], both))
    assert int(regions["question"].sum()) == len(q.ids) and int(regions["start"].sum()) == 4
