"""posenc.hf.sparse: DeepSeek sparse attention (DeepSeek V3.2, GLM-MoE-DSA) under extend: "none" is the untouched
model, the engine honours the selection, cached decoding equals recomputing, a method changes the sparse layers."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.hf.test_layers import make_model

transformers = pytest.importorskip("transformers")

from posenc import hf  # noqa: E402
from posenc._util import assert_close  # noqa: E402

V = 300


def prompts(n=24, pad=3):
    x = torch.randint(1, V, (2, n), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(x)
    x[0, :pad], mask[0, :pad] = 0, 0
    return x, mask, (mask.cumsum(-1) - 1).clamp(min=0)  # positions count real tokens, as generate() does


def logits(model, x, mask, pos):
    with torch.no_grad():
        return model(x, attention_mask=mask, position_ids=pos).logits[mask.bool()]


# ===================================================================== DeepSeek sparse attention (posenc.hf.sparse)
DSA_CASES = [("deepseek_v32", 2048), ("deepseek_v32", 4), ("glm_moe_dsa", 4)]  # 2048: every key selected


@pytest.mark.parametrize("family,topk", DSA_CASES, ids=[f"{f}-top{k}" for f, k in DSA_CASES])
@pytest.mark.parametrize("tile", [None, 1], ids=["tiles", "row_by_row"])
def test_dsa_none_unchanged_and_engine_honours_the_selection(family, topk, tile, monkeypatch):
    """DeepSeek sparse attention: "none" is the untouched model, and the engine running plain RoPE (ReRoPE
    with a window past the sequence) reproduces transformers' logits on a left-padded batch: the indexer
    keeps its real rotation and sees the causal + padding mask, and each query attends only to the keys it
    selected. With index_topk 4 < 24 tokens the selection drops keys (the logits differ from the same
    weights with every key selected), on GLM's shared layer too; one sparse query row per engine call
    (``tile=1``) gives what the tiles give."""
    from posenc.hf import sparse

    if tile is not None:
        monkeypatch.setattr(sparse, "TILE_ELEMENTS", tile)
    model = make_model(family, index_topk=topk)
    x, mask, pos = prompts()
    ref = logits(model, x, mask, pos)
    if topk < x.shape[1]:
        assert not torch.allclose(logits(make_model(family), x, mask, pos), ref, atol=1e-3)
    assert torch.equal(logits(hf.extend(copy.deepcopy(model), "none"), x, mask, pos), ref)
    ext = hf.extend(copy.deepcopy(model), "rerope", window=64)
    assert ext.config._attn_implementation == "posenc"
    assert_close(logits(ext, x, mask, pos), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family,topk", DSA_CASES, ids=[f"{f}-top{k}" for f, k in DSA_CASES])
def test_dsa_generate_cache_equals_no_cache(family, topk):
    """Cached decoding (the indexer's key cache, one query against the selection) equals recomputing the
    whole sequence, under a method that changes the attention (ReRoPE, window 16 < 22 tokens)."""
    model = hf.extend(make_model(family, index_topk=topk), "rerope", window=16)
    x, mask, _ = prompts(n=14)
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        assert torch.equal(model.generate(x, use_cache=True, **kw), model.generate(x, use_cache=False, **kw))


def test_dsa_method_changes_the_sparse_attention():
    """The method reaches the sparse layers: ReRoPE with a window shorter than the sequence changes the
    logits of the index_topk-4 model (so the equality above is not the engine being bypassed)."""
    x, mask, pos = prompts()
    model = make_model("deepseek_v32", index_topk=4)
    ref = logits(model, x, mask, pos)
    assert not torch.allclose(logits(hf.extend(model, "rerope", window=4), x, mask, pos), ref, atol=1e-4)
