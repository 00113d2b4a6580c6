"""posenc.evals.calibrate: DuoAttention's training-free head choice keeps the heads whose output streaming changes
most, on a TinyLM and on a transformers Llama."""

from __future__ import annotations

import copy

import pytest
import torch

import posenc
import posenc.hf
from posenc import PositionScheme
from posenc._util import relative_error
from posenc.parts.retrieval import duo_query_heads


def test_calibration_keeps_the_heads_whose_output_streaming_changes_most():
    from posenc.evals.calibrate import calibrate_duo, head_deviation, record_calls

    torch.manual_seed(0)
    model = posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, train_len=64,
                                          scheme=PositionScheme.preset("rope", train_len=64))).eval()
    ids = torch.randint(0, 64, (1, 90), generator=torch.Generator().manual_seed(2))
    heads = calibrate_duo(lambda: model(ids), 2, n_sinks=2, window=16, retrieval_fraction=0.5)
    calls: list = []
    with record_calls(calls):
        model(ids)
    errors = torch.cat([(lambda d, n: d / n)(*head_deviation(c, hk, sc, 2, 16)) for c, hk, sc in calls])
    keep = set(torch.argsort(errors, descending=True)[:2].tolist())  # 2 of 4 (layer, KV head) pairs
    want = [duo_query_heads([g for g in range(2) if 2 * layer + g not in keep], 4, 2) for layer in range(2)]
    assert heads == want and sum(len(h) for h in heads) == 4
    assert calibrate_duo(lambda: model(ids), 2, n_sinks=2, window=90, retrieval_fraction=0.0) == [[0, 1, 2, 3]] * 2
    with pytest.raises(ValueError, match="n_layers"):
        calibrate_duo(lambda: model(ids), 3)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=576, intermediate_size=64, num_hidden_layers=2, num_attention_heads=9,
                                   num_key_value_heads=3, vocab_size=120, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_hf_duo_calibrated_on_the_model_itself():
    from posenc.evals.calibrate import calibrate_duo

    base = _tiny_llama()
    probe = posenc.hf.extend(copy.deepcopy(base), "duo")  # every head retrieving: the engine sees every layer
    ids = torch.randint(0, 120, (1, 64), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        heads = calibrate_duo(lambda: probe(ids), 2, n_sinks=2, window=8, retrieval_fraction=0.5)
        assert sum(len(h) for h in heads) == 9  # 3 of 6 KV heads stream: 3 x 3 query heads
        model = posenc.hf.extend(copy.deepcopy(base), "duo", streaming=heads, n_sinks=2, window=8)
        assert torch.isfinite(model(ids).logits).all()
        assert relative_error(probe(ids).logits, base(ids).logits) <= 1e-5  # no streaming head: the model itself
