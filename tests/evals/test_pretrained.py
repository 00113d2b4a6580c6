"""posenc.evals.pretrained: ``evaluate_hf`` uses the model's own tokenizer and refuses others."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")



from tests.support.tiny_hf import make_model  # noqa: E402


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
