"""posenc.parts.resonance: Resonance RoPE's rounding of wavelengths by hand, stacked on a schedule, repeating trained
angles; and posenc against the original (sheryc/resonance_rope) run unchanged in its own environment
(``benchmarks/originals/``): the fixture holds the original's logits on a tiny Llama whose weights both sides draw
from :func:`tiny_weights`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from benchmarks.originals.resonance import CONFIG, TRAIN_LEN, input_ids, tiny_weights
from posenc import PositionScheme
from posenc.parts.frequencies import rope_frequencies

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "originals"


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


# ============================================================================ Resonance RoPE
def test_resonance_rounds_every_wavelength_by_hand():
    """d = 8, base 10000: wavelengths 2 pi 10^(2i/8... ) = 6.283, 62.83, 628.3, 6283 -> 6, 63, 628, 6283."""
    s = PositionScheme.preset("resonance", train_len=64)
    f = rope_frequencies(8, scaling=s.rope.scaling)
    assert torch.allclose(2 * math.pi / f.inv_freq.double(), torch.tensor([6.0, 63.0, 628.0, 6283.0],
                                                                          dtype=torch.float64), rtol=1e-6, atol=0)


@pytest.mark.parametrize("spec, kw", [("yarn+resonance", {"factor": 4.0}), ("resonance+yarn", {"factor": 4.0}),
                                      ("resonance+ntk", {"factor": 2.0}), ("dynamic_yarn+resonance", {})])
def test_resonance_stacks_on_a_schedule(spec, kw):
    """sheryc/resonance_rope's Resonance-YaRN: YaRN's frequencies, then theta' = 2 pi / round(2 pi / theta); the
    attention factor is YaRN's."""
    s = PositionScheme.preset(spec, train_len=32, **kw)
    plain = dict(s.rope.scaling)
    del plain["resonance"]
    for n in (20, 100) if s.is_dynamic else (None,):
        ours = rope_frequencies(32, scaling=s.rope.scaling, seq_len=n)
        base = rope_frequencies(32, scaling=plain, seq_len=n)
        want = 2 * math.pi / torch.round(2 * math.pi / base.inv_freq.double())
        assert torch.allclose(ours.inv_freq.double(), want, rtol=1e-6, atol=0)
        assert ours.attention_scale == base.attention_scale


def test_resonance_repeats_trained_angles():
    """A dimension with an integer wavelength lambda rotates position t + lambda exactly as t."""
    s = PositionScheme.preset("resonance", train_len=64)
    inv = rope_frequencies(16, scaling=s.rope.scaling).inv_freq.double()
    lam = torch.round(2 * math.pi / inv)
    for i in range(4):
        t = torch.tensor([5.0, 5.0 + float(lam[i])])
        ang = (t * inv[i]) % (2 * math.pi)
        assert abs(float(ang[0] - ang[1])) < 1e-6
