"""posenc against originals run unchanged in their own environment (``benchmarks/originals/``): the fixture holds
the original's logits on a tiny Llama whose weights both sides draw from :func:`tiny_weights`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.originals.resonance import CONFIG, TRAIN_LEN, input_ids, tiny_weights

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "originals"


@pytest.mark.parametrize("spec, kw", [("resonance", {}), ("resonance+yarn", {"factor": 2.0})])
def test_resonance_equals_sheryc_resonance_rope(spec, kw):
    """sheryc/resonance_rope's own modeling_llama_yarn.py (transformers 4.36.2) against posenc.hf.extend on
    transformers' Llama: float noise (the original computes angles (t mod lambda) * theta' in float32)."""
    transformers = pytest.importorskip("transformers")
    import posenc.hf

    fx = json.loads((FIXTURES / "resonance.json").read_text())
    assert fx["ids"] == input_ids()[0].tolist()
    cfg = transformers.LlamaConfig(**CONFIG, max_position_embeddings=TRAIN_LEN)
    model = transformers.LlamaForCausalLM(cfg).eval()
    tiny_weights(model)
    model = posenc.hf.extend(model, spec, **kw)
    with torch.no_grad():
        ours = model(input_ids()).logits[0]
    want = torch.tensor(fx["logits"][spec])
    err = float((ours - want).abs().max())
    assert err <= 2e-5, f"max |delta logits| {err:.2e} against {fx['original']}@{fx['commit'][:7]}"
    plain = transformers.LlamaForCausalLM(cfg).eval()
    tiny_weights(plain)
    with torch.no_grad():  # the comparison can fail: without the rounding the logits move by far more
        assert float((plain(input_ids()).logits[0] - want).abs().max()) > 1e-3


def test_report_resonance_max_delta(capsys):
    """Prints the measured max |delta logits| per case (the numbers docs/guides/conventions.md and the closing note
    quote)."""
    transformers = pytest.importorskip("transformers")
    import posenc.hf

    fx = json.loads((FIXTURES / "resonance.json").read_text())
    for spec, kw in (("resonance", {}), ("resonance+yarn", {"factor": 2.0})):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, max_position_embeddings=TRAIN_LEN))
        tiny_weights(model.eval())
        model = posenc.hf.extend(model, spec, **kw)
        with torch.no_grad():
            err = float((model(input_ids()).logits[0] - torch.tensor(fx["logits"][spec])).abs().max())
        print(f"{spec}: max |delta logits| = {err:.1e}")
        assert err <= 2e-5
