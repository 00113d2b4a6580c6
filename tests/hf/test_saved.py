"""posenc.hf.saved: an engine-extended model saves in a form plain transformers refuses and posenc's custom code
loads; the earlier save format still loads."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf import patch as hf  # noqa: E402

LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=128, max_position_embeddings=64, pad_token_id=0)


def _llama(cfg=None):
    torch.manual_seed(0)
    cfg = cfg or transformers.LlamaConfig(**LLAMA)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


# ============================================================ round 3: no silent NoPE, no silent unextended save
X = torch.randint(1, 128, (1, 100), generator=torch.Generator().manual_seed(2))  # beyond the trained 64


def _logits(model, x=X):
    with torch.no_grad():
        return model(x).logits


def test_engine_methods_save_in_a_form_plain_transformers_refuses_and_custom_code_loads(tmp_path):
    from posenc.hf.saved import CODE_FILE, MODEL_TYPE

    model = hf.extend(_llama(), "rerope+logn", window=16)
    out = hf.save(model, tmp_path / "rerope")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == MODEL_TYPE and cfg["posenc"]["method"] == "rerope+logn"
    assert cfg["base_config"]["model_type"] == "llama" and (out / CODE_FILE).is_file()
    for kw in ({}, {"trust_remote_code": False}):  # plain transformers: refused, never loaded unextended
        with pytest.raises(ValueError, match="(?s)contains custom code which must be executed.*trust_remote_code=True"):
            transformers.AutoModelForCausalLM.from_pretrained(out, **kw)
    want = _logits(model)
    for loaded in (hf.load(out), transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)):
        assert loaded.config.posenc["method"] == "rerope+logn"
        torch.testing.assert_close(_logits(loaded.eval()), want, rtol=1e-5, atol=1e-5)


def test_the_earlier_save_format_still_loads(tmp_path):
    """A config with the posenc section inside the model's own config (posenc before this format) loads extended."""
    model = hf.extend(_llama(), "rerope", window=16)
    out = hf.save(model, tmp_path / "old")
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg["base_config"], "posenc": cfg["posenc"]}))
    torch.testing.assert_close(_logits(hf.load(out)), _logits(model), rtol=1e-5, atol=1e-5)
