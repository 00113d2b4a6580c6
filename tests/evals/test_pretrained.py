"""posenc.evals.pretrained: ``evaluate_hf`` uses the model's own tokenizer and refuses others."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")



L = 16  # trained length (max_position_embeddings) of every tiny model

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
              intermediate_size=128, max_position_embeddings=L, pad_token_id=0, bos_token_id=None, eos_token_id=None)

ARCHS = {
    "llama": (transformers.LlamaConfig, {}),
    "mistral": (transformers.MistralConfig, {"sliding_window": None}),
    "qwen2": (transformers.Qwen2Config, {}),
    "qwen3": (transformers.Qwen3Config, {"head_dim": 16}),
    "gemma": (transformers.GemmaConfig, {"head_dim": 16}),
    "gemma2": (transformers.Gemma2Config, {"head_dim": 16, "sliding_window": 6, "attn_logit_softcapping": None}),
    "phi3": (transformers.Phi3Config, {"partial_rotary_factor": 0.5}),
    "gpt_neox": (transformers.GPTNeoXConfig, {"rotary_pct": 0.5, "num_key_value_heads": None}),
}


def make_config(arch="llama", **kw):
    cls, extra = ARCHS[arch]
    args = {**COMMON, **extra, **kw}
    args = {k: v for k, v in args.items() if not (k == "num_key_value_heads" and v is None)}
    cfg = cls(**args)
    cfg._attn_implementation = "eager"
    return cfg


def make_model(arch="llama", seed=0, **kw):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(make_config(arch, **kw)).eval()


def test_hf_eval_uses_the_models_own_tokenizer_and_refuses_others(tmp_path):
    """A byte tokenizer on a model that has its own is refused; a model without a tokenizer is refused; the
    text is scored with the model's own tokenizer (the same target tokens at every length)."""
    from posenc.data.tokenizer import make_tokenizer
    from posenc.evals.pretrained import evaluate_hf
    from posenc.hf.export import byte_tokenizer

    make_model("llama").save_pretrained(tmp_path / "bare")
    text = "The grass is green. The sky is blue. " * 12
    with pytest.raises(ValueError, match="no tokenizer of its own"):
        evaluate_hf(tmp_path / "bare", text=text, lengths=[32])
    byte_tokenizer().save_pretrained(tmp_path / "bare")
    with pytest.raises(ValueError, match="transformers tokenizer"):
        evaluate_hf(tmp_path / "bare", text=text, lengths=[32], tokenizer=make_tokenizer("byte"))
    a = evaluate_hf(tmp_path / "bare", text=text, lengths=[32, 64], max_windows=2, target=16)
    assert [r["tokens"] for r in a] == [32, 32]  # 2 windows x 16 target tokens at both lengths
    assert a[0]["target_tokens"] == 16 and a[0]["windows"] == 2
    with pytest.raises(ValueError, match="needs more than"):
        evaluate_hf(tmp_path / "bare", text=text[:100], lengths=[200])
