"""posenc.models.tinylm: forward and backward under every trained preset, with_scheme keeps the weights, a learned
table beyond its length, Transformer-XL's recurrence, LMConfig round trips and refusals, bad token ids."""

from __future__ import annotations

import json

import pytest
import torch

from posenc._util import assert_close
from posenc.models.tinylm import LMConfig, TinyLM
from posenc.scheme.core import TRAINED, PositionScheme

L = 16

PATTERNS = {"irope": {"every": 2}, "local_global": {"every": 2}, "nope_every4": {"every": 2}}


def pattern(name, **kw):
    return PositionScheme.preset(name, train_len=L, **{**PATTERNS[name], **kw})


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_config_round_trip(name):
    cfg = LMConfig(vocab_size=64, dim=32, n_layers=4, n_heads=4, scheme=pattern(name), train_len=L)
    again = LMConfig.from_dict(json.loads(cfg.to_json()))
    assert again == cfg and again.layer_schemes == cfg.layer_schemes
    assert [s.name for s in cfg.layer_schemes] == [s.name for s in pattern(name).layers] * 2


# layer patterns (irope, local_global, nope_every4) are checked layer by layer in tests/scheme/test_pattern.py
SINGLE = sorted(n for n in TRAINED if PositionScheme.preset(n, train_len=32).layers is None)


def _tiny(name, **kw):
    s = PositionScheme.preset(name, train_len=16, **kw)
    return TinyLM(LMConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, scheme=s, train_len=16))


# The scheme's own learned parameters (name suffixes inside TinyLM); every other parameter is the plain
# decoder's. Fixed schemes (sinusoidal, rope, xpos, alibi, sandwich, nope) add none.
POSITIONAL_PARAMS = {
    "complex_order": {"pos.omega", "pos.theta"},
    "deberta": {"relative.k_rel", "relative.q_rel"},
    "floater": {"pos.p0", "pos.dynamics.net.0.weight", "pos.dynamics.net.0.bias", "pos.dynamics.net.2.weight",
                "pos.dynamics.net.2.bias"},
    "hierarchical": {"pos.table"},
    "infini": {"memory.beta"},
    "rope_mixed": {"multiaxis.freqs"},
    "kerple_log": {"bias.r1", "bias.r2"},
    "kerple_power": {"bias.r1", "bias.r2"},
    "learned": {"pos.table"},
    "shaw": {"relative.key_table", "relative.value_table"},
    "t5": {"bias.weight"},
    "transformer_xl": {"relative.u", "relative.v", "relative.w_r"},
    "cope": {"relative.pos_emb"},
    "fox": {"gate.weight", "gate.bias"},
    "fire": {"bias.c", "bias.threshold", "bias.w1", "bias.b1", "bias.w2", "bias.b2"},
}


# Parameters allowed to receive no gradient, with the reason. None at N = train_len: every learned
# part is reached by the loss (Shaw's value table and XL's u, v start at zero but their gradients do not).
NO_GRAD: dict[str, str] = {}


@pytest.mark.parametrize("name", SINGLE)
def test_tinylm_forward_and_backward_every_trained_preset(name):
    torch.manual_seed(0)
    m = _tiny(name)
    ids = torch.randint(0, 50, (2, 16))
    logits = m(ids)
    assert logits.shape == (2, 16, 50) and torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    plain = {n for n, _ in _tiny("nope").named_parameters()}
    own = {n.split(".attn.parts.")[-1].split(".attn.")[-1] for n, _ in m.named_parameters() if n not in plain}
    assert own == POSITIONAL_PARAMS.get(name, set())
    for n, p in m.named_parameters():
        if n in NO_GRAD:
            continue
        assert p.grad is not None, f"{name}: {n} gets no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {n} has a non-finite gradient"
        assert p.grad.abs().max() > 0, f"{name}: {n} has an all-zero gradient"


def test_with_scheme_keeps_weights_and_changes_only_positions():
    torch.manual_seed(0)
    m = _tiny("rope").eval()
    ids = torch.randint(0, 50, (1, 12))
    same = m.with_scheme("rerope", window=100)  # window beyond the sequence: identical
    assert_close(same(ids), m(ids), rtol=1e-5, atol=1e-6)
    other = m.with_scheme("yarn", factor=4)
    assert not torch.allclose(other(ids), m(ids))
    assert other.scheme.rope.scaling["rope_type"] == "yarn"


def test_learned_beyond_table_refuses_and_hierarchical_extends():
    torch.manual_seed(0)
    m = _tiny("learned").eval()
    with pytest.raises(ValueError, match="hierarchical"):
        m(torch.randint(0, 50, (1, 20)))
    h = m.with_scheme("hierarchical")
    ids = torch.randint(0, 50, (1, 16))
    assert_close(h(ids), m(ids), rtol=0, atol=0)  # equal on the trained positions
    assert h(torch.randint(0, 50, (1, 200))).shape == (1, 200, 50)


def test_transformer_xl_recurrence_sees_previous_segment():
    torch.manual_seed(0)
    m = _tiny("transformer_xl", mem_len=8).eval()
    ids = torch.randint(0, 50, (1, 32))
    ids2 = ids.clone()
    ids2[0, 2] = (ids[0, 2] + 1) % 50
    a, b = m(ids), m(ids2)
    assert not torch.allclose(a[:, 8:16], b[:, 8:16])  # segment 2 sees segment 1 through memory
    # each layer looks one segment back, so information travels n_layers (=2) segments, no further
    assert not torch.allclose(a[:, 16:24], b[:, 16:24])
    assert torch.allclose(a[:, 24:], b[:, 24:], atol=1e-6)

P = PositionScheme


def tiny_lm(scheme=None, vocab=32, dim=16, n_layers=1, seed=0):
    torch.manual_seed(seed)
    scheme = scheme or P.preset("rope", train_len=16)
    return TinyLM(LMConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=2, scheme=scheme,
                           train_len=16)).eval()


# ------------------------------------------------------------------------------------------------ TinyLM
@pytest.mark.parametrize("field, value, match", [
    ("dropout", "x", r"LMConfig.dropout must be a finite number, got 'x'"),
    ("dropout", 1.0, r"LMConfig.dropout must be in \[0, 1\)"),
    ("dropout", -0.1, r"LMConfig.dropout must be >= 0.0"),
    ("dropout", float("nan"), r"LMConfig.dropout must be finite"),
    ("vocab_size", 0, r"LMConfig.vocab_size must be an integer >= 1"),
    ("n_layers", "2", r"LMConfig.n_layers must be an integer >= 1"),
    ("n_heads", 3, r"dim \(16\) must be divisible by n_heads \(3\)"),
    ("n_kv_heads", 3, r"n_heads \(2\) must be a multiple of n_kv_heads \(3\)"),
    ("n_kv_heads", 0, r"LMConfig.n_kv_heads must be an integer >= 1"),
    ("scheme", "rope", r"LMConfig.scheme must be a PositionScheme"),
])
def test_lm_config_refuses_bad_values(field, value, match):
    kw = dict(vocab_size=32, dim=16, n_layers=1, n_heads=2, scheme=P.preset("rope", train_len=16), train_len=16)
    kw[field] = value
    with pytest.raises(ValueError, match=match):
        LMConfig(**kw)


@pytest.mark.parametrize("change, match", [
    ({"dropout": "x"}, r"LMConfig.dropout must be a finite number"),
    ({"bogus": 1}, r"unknown fields \['bogus'\]"),
    ({"scheme": {"logn": "no", "train_len": 16}}, r"logn must be true or false"),
])
def test_lm_config_from_dict_refuses_bad_configs(change, match):
    d = {**tiny_lm().cfg.to_dict(), **change}
    with pytest.raises(ValueError, match=match):
        LMConfig.from_dict(d)


@pytest.mark.parametrize("ids, match", [
    (torch.tensor([[1, 2, 32]]), r"input_ids must be in \[0, vocab_size=32\), got ids from 1 to 32"),
    (torch.tensor([[1, -1]]), r"input_ids must be in \[0, vocab_size=32\)"),
    (torch.zeros(1, 0, dtype=torch.long), r"at least one row and one token"),
    (torch.zeros(0, 4, dtype=torch.long), r"at least one row and one token"),
    (torch.zeros(1, 4), r"input_ids must be an integer tensor"),
    (torch.zeros(4, dtype=torch.long), r"input_ids must be an integer tensor \[batch, seq\]"),
])
def test_tinylm_refuses_bad_token_ids(ids, match):
    with pytest.raises(ValueError, match=match):
        tiny_lm()(ids)
