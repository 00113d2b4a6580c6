"""p-RoPE, CoPE, FoX and FIRE: each against its reference (transformers' ``proportional`` RoPE and Gemma 4's
rotation; x-transformers' ``CoPE`` and ``DataDependentAlibi``; FIRE's formula on a 3 x 3 case computed by
hand), every backend equal to ``reference``, cached decoding equal to the full forward, and the records."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import PositionalAttention, PositionScheme
from posenc._util import assert_close, relative_error
from posenc.engine import make_call, run_attention
from posenc.engine.parts import AttentionParts
from posenc.engine.scores import rotate_branch
from posenc.methods import METHODS, TRAINED_METHODS
from posenc.models.cache import KVCache
from posenc.models.generation import left_padded_positions
from posenc.scheme.core import TRAINED

NEW = ("p_rope", "cope", "fox", "fire")


def _scheme(name, train_len=16, **params):
    return PositionScheme.preset(name, train_len=train_len, **params)


def _randomize_(module, scale=0.5, seed=0):
    """Give the learned positional parts non-trivial values (CoPE's table starts at zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "pos_emb" in name or "gate." in name or ".bias.w" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module


# ============================================================================ p-RoPE
def _gemma4_rotary(head_dim=64, p=0.25, theta=1e6):
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    cfg = Gemma4TextConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=head_dim,
                           layer_types=["sliding_attention", "full_attention"],
                           rope_parameters={"full_attention": {"rope_type": "proportional", "rope_theta": theta,
                                                               "partial_rotary_factor": p},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    return Gemma4TextRotaryEmbedding(cfg)


@pytest.mark.parametrize("p", [0.25, 0.5, 1.0])
def test_p_rope_equals_gemma4_proportional_rope(p):
    """Same inv_freq, cos/sin and rotated q/k as transformers' ``proportional`` rope type in Gemma 4, on
    identical inputs (the engine's own rotation path, rotate_branch)."""
    from transformers.models.gemma4.modeling_gemma4 import apply_rotary_pos_emb

    D, H, N = 64, 2, 40
    hf = _gemma4_rotary(D, p)
    parts = AttentionParts(PositionScheme.preset("rope", base=1e6).extend("p_rope", p=p), H, D)
    freqs = parts.frequencies(None)
    assert_close(freqs.inv_freq, hf.full_attention_inv_freq, rtol=1e-6, atol=0, name="inv_freq")
    assert int((freqs.inv_freq > 0).sum()) == int(p * D // 2)  # the highest frequencies stay, the rest are 0

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D) for _ in range(3))
    pos = torch.arange(N)[None] + 7
    cos, sin = hf(q.transpose(1, 2), pos, "full_attention")  # [1,N,D]
    from posenc.parts.rotary import rope_cos_sin

    ours_cos, ours_sin = rope_cos_sin(pos, freqs.inv_freq)  # [1,1,N,D/2]
    assert_close(torch.cat([ours_cos, ours_cos], -1)[:, 0], cos, rtol=0, atol=1e-5, name="cos")
    assert_close(torch.cat([ours_sin, ours_sin], -1)[:, 0], sin, rtol=0, atol=1e-5, name="sin")

    call = make_call(parts, q, k, v, pos, pos).scheduled(freqs, torch.ones(1, 1, N, 1))
    rot = rotate_branch(call, parts.branches[0])
    assert_close(rot.q, apply_rotary_pos_emb(q, cos, sin), rtol=0, atol=1e-5, name="rotated q")
    assert_close(rot.k, apply_rotary_pos_emb(k, cos, sin), rtol=0, atol=1e-5, name="rotated k")
    rotated = int(p * D // 2)
    nope = torch.cat([torch.arange(rotated, D // 2), torch.arange(D // 2 + rotated, D)])
    assert torch.equal(rot.k[..., nope], k[..., nope])  # NoPE pairs: not rotated at all


def test_p_rope_record_and_errors():
    s = PositionScheme.preset("p_rope", train_len=32, p=0.5)
    assert s.rope.scaling == {"rope_type": "proportional", "partial_rotary_factor": 0.5}
    assert METHODS["p_rope"].hf_rope_type == "proportional"
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="p"):
            PositionScheme.preset("p_rope", train_len=32, p=bad)
    with pytest.raises(ValueError, match="do not stack"):
        PositionScheme.preset("yarn", train_len=32, factor=2.0).extend("p_rope")
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        PositionScheme.preset("rope", partial_rotary_factor=0.5).extend("p_rope")


# ============================================================================ FIRE
def test_fire_bias_equals_the_formula_on_a_hand_computed_3x3_case():
    """bias(i, j) = f(psi(|i-j|) / psi(max(L, i))), psi(x) = log(c x + 1), with c = 1, L = 1.5 and a
    2-unit MLP f(x) = 0.1 + 2 relu(x) + 3 relu(0.5 - x). By hand (ln 2 = 0.693147, ln 2.5 = 0.916291,
    ln 3 = 1.098612):
      i = 0, 1: normaliser ln(1 + 1.5) = 0.916291;  i = 2: ln(1 + 2) = 1.098612
      x(1,0) = x(0,1) = x(1,2) = 0.693147 / 0.916291 = 0.756471   -> f = 0.1 + 2 * 0.756471 = 1.612942
      x(0,2) = 1.098612 / 0.916291 = 1.198978                      -> f = 0.1 + 2 * 1.198978 = 2.497956
      x(2,0) = 1.098612 / 1.098612 = 1                             -> f = 2.1
      x(2,1) = 0.693147 / 1.098612 = 0.630930                      -> f = 0.1 + 2 * 0.630930 = 1.361860
      x(i,i) = 0                                                   -> f = 0.1 + 3 * 0.5 = 1.6"""
    from posenc.parts.biases import FireBias

    bias = FireBias(1, hidden=2, c=1.0, threshold=1.5)
    with torch.no_grad():
        bias.w1.copy_(torch.tensor([1.0, -1.0]))
        bias.b1.copy_(torch.tensor([0.0, 0.5]))
        bias.w2.copy_(torch.tensor([[2.0, 3.0]]))
        bias.b2.copy_(torch.tensor([0.1]))
    expected = torch.tensor([[1.6, 1.612942, 2.497956],
                             [1.612942, 1.6, 1.612942],
                             [2.1, 1.361860, 1.6]])
    assert_close(bias(torch.arange(3), torch.arange(3))[0, 0], expected, rtol=0, atol=2e-6, name="FIRE bias")
    # through the engine: softmax(q.k / sqrt(D) + bias) over the causal keys
    parts = AttentionParts(_scheme("fire", hidden=2, c=1.0, threshold=1.5), 1, 4)
    parts.bias.load_state_dict(bias.state_dict())
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 1, 3, 4) for _ in range(3))
    logits = (q @ k.transpose(-1, -2)) / 2.0 + expected
    logits = logits.masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))
    for impl in ("reference", "sdpa", "blockwise"):
        with torch.no_grad():
            got = run_attention(parts, q, k, v, impl=impl)
        assert_close(got, torch.softmax(logits, -1) @ v, rtol=1e-5, atol=1e-6, name=impl)


def test_fire_parameters_are_checked():
    with pytest.raises(ValueError, match="fire.c"):
        _scheme("fire", c=0.0)
    with pytest.raises(ValueError, match="fire.threshold"):
        _scheme("fire", threshold=0.5)
    with pytest.raises(ValueError, match="does not take"):
        _scheme("fire", slope=1.0)
    assert _scheme("fire", train_len=48).bias.params == {"threshold": 48.0}


# ============================================================================ CoPE
def _cope_parts(H, D, npos):
    parts = AttentionParts(_scheme("cope", npos_max=npos), H, D)
    return _randomize_(parts)


@pytest.mark.parametrize("npos", [4, 64])
def test_cope_equals_x_transformers(npos):
    """posenc's CoPE on the engine equals x-transformers' ``Attend(causal=True, cope=CoPE(...))`` on the same
    q, k, v and position table (npos 4: positions clipped; 64: interpolated everywhere), with and without
    padding keys."""
    from x_transformers.attend import Attend
    from x_transformers.x_transformers import CoPE

    B, H, N, D = 2, 3, 24, 8
    parts = _cope_parts(H, D, npos)
    ref_cope = CoPE(dim=D, heads=H, max_pos=npos)
    with torch.no_grad():
        ref_cope.pos_emb.copy_(parts.relative.pos_emb)
    attend = Attend(causal=True, cope=ref_cope)
    torch.manual_seed(2)
    q, k, v = (torch.randn(B, H, N, D) * 2 for _ in range(3))
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, :5] = False
    with torch.no_grad():
        for key_mask in (None, mask):
            ref, _ = attend(q, k, v, mask=None if key_mask is None else key_mask[:, None, None, :])
            ours = run_attention(parts, q, k, v, impl="reference", key_mask=key_mask)
            rows = slice(None) if key_mask is None else (slice(None), slice(None), slice(5, None))
            assert_close(ours[rows], ref[rows], rtol=1e-5, atol=1e-5, name=f"CoPE key_mask={key_mask is not None}")


def test_cope_refuses_unsorted_keys():
    parts = _cope_parts(1, 4, 8)
    q, k, v = (torch.randn(1, 1, 3, 4) for _ in range(3))
    with pytest.raises(ValueError, match="key positions"):
        run_attention(parts, q, k, v, torch.tensor([[2, 2, 2]]), torch.tensor([[0, 2, 1]]))


# ============================================================================ FoX
def test_fox_gate_equals_x_transformers_data_dependent_alibi():
    """The forget-gate bias c_i - c_j equals x-transformers' ``DataDependentAlibi(x)`` on the same weights,
    and attention with it equals ``Attend(causal=True)`` given that bias; through PositionalAttention, the
    gate reads the layer input x."""
    from x_transformers.attend import Attend
    from x_transformers.x_transformers import DataDependentAlibi

    from posenc.parts.gates import forget_bias

    B, H, N, dim = 2, 4, 20, 32
    torch.manual_seed(3)
    m = PositionalAttention(dim, H, _scheme("fox"))
    ref = DataDependentAlibi(dim, H)
    with torch.no_grad():
        m.gate.weight.copy_(torch.randn(H, dim))  # strong, varied gates
        m.gate.bias.copy_(torch.randn(H))
        ref.to_forget_gates[0].weight.copy_(m.gate.weight)
        ref.to_forget_gates[0].bias.copy_(m.gate.bias)
    x = torch.randn(B, N, dim)
    with torch.no_grad():
        c = m.gate(x).cumsum(-1)  # [B,H,N]
        pos = torch.arange(N)
        ours = forget_bias(c[..., :, None], c[..., None, :], pos[:, None], pos[None])
        theirs = ref(x)
        causal = torch.ones(N, N, dtype=torch.bool).tril()
        assert_close(ours[..., causal], theirs[..., causal], rtol=1e-5, atol=1e-5, name="FoX bias")
        assert float(theirs[..., causal].min()) < -5  # the decay is far from negligible here
        q, k, v = m.project(x)
        expected, _ = Attend(causal=True)(q, k, v, attn_bias=theirs)
        assert_close(m(x), m.o_proj(expected.transpose(1, 2).reshape(B, N, dim)), rtol=1e-5, atol=1e-6,
                     name="PositionalAttention")


def test_fox_needs_its_gates():
    s = _scheme("fox")
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    with pytest.raises(ValueError, match="forget gate"):
        posenc.attention(q, k, v, s)
    with pytest.raises(ValueError, match="gates"):
        run_attention(AttentionParts(s, 2, 8), q, k, v, gates=(torch.zeros(1, 2, 4), torch.zeros(1, 2, 5)))
    with pytest.raises(ValueError, match="no forget gate"):
        run_attention(AttentionParts(_scheme("rope"), 2, 8), q, k, v, gates=(torch.zeros(1, 2, 5),) * 2)
    with pytest.raises(ValueError, match="memory"):
        PositionScheme(gate=s.gate, memory=_scheme("infini").memory, train_len=16)


# ============================================================================ every backend
def _backends_vs_reference(name, impls, n, seed=4, padded=(False, True)):
    torch.manual_seed(seed)
    m = _randomize_(PositionalAttention(32, 4, _scheme(name)).eval())
    x = torch.randn(2, n, 32)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, :37] = False
    with torch.no_grad():
        for key_mask in [mask if p else None for p in padded]:
            ref = m(x, impl="reference", key_mask=key_mask)
            for impl in impls:
                err = relative_error(m(x, impl=impl, key_mask=key_mask), ref)
                assert err <= 1e-5, (name, impl, key_mask is not None, err)


@pytest.mark.parametrize("name", NEW)
def test_every_backend_equals_reference(name):
    """blockwise, sdpa, toeplitz/band/sinks (their fallbacks where they cannot run it) and auto equal the
    reference at a length with two blockwise tiles (auto: past the size where it leaves the reference),
    with and without padding keys. (Compiled flex: below, and every preset in test_attention.)"""
    _backends_vs_reference(name, ("blockwise", "sdpa", "toeplitz", "band", "sinks", "auto"), 300)


@pytest.mark.compile
@pytest.mark.parametrize("name", ["cope", "fox"])
def test_flex_equals_reference_with_padding(name):
    """impl="flex" with padding keys (without: every preset in test_attention): FoX's gates as a score_mod,
    padded to whole blocks with the keys; CoPE takes the documented blockwise fallback."""
    _backends_vs_reference(name, ("flex",), 130, padded=(True,))


@pytest.mark.parametrize("name", ["fox", "fire"])
def test_compiled_flex_runs_the_data_and_learned_biases(name):
    """FoX's gates and FIRE's MLP are score_mods: at inference flex runs them itself (no fallback)."""
    from posenc.engine import choose_backend

    m = _randomize_(PositionalAttention(32, 4, _scheme(name)))
    x = torch.randn(1, 20, 32)
    q, k, v = m.project(x)
    gates = None
    if name == "fox":
        c = m.gate(x).cumsum(-1).detach()
        gates = (c, c)
    with torch.no_grad():
        backend, declined = choose_backend(make_call(m.parts, q, k, v, gates=gates), "flex")
    assert backend.name == "flex", declined


# ============================================================================ cached decoding
def _model(scheme, seed=0):
    torch.manual_seed(seed)
    model = posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, scheme=scheme,
                                          train_len=16)).eval()
    return _randomize_(model, seed=seed)


def _full_and_decoded(model, prefill=12, total=40, short=31):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, total), generator=g)
    mask = torch.ones(2, total, dtype=torch.long)
    mask[1, :total - short] = 0
    pos = left_padded_positions(mask)
    with torch.no_grad():
        full = model(ids, positions=pos, attention_mask=mask)
        cache = KVCache.for_model(model, 2)
        outs = [model(ids[:, :prefill], positions=pos[:, :prefill], cache=cache, attention_mask=mask[:, :prefill])]
        outs += [model(ids[:, t:t + 1], cache=cache) for t in range(prefill, total)]
    return full[mask.bool()], torch.cat(outs, dim=1)[mask.bool()], cache


@pytest.mark.parametrize("name", NEW)
def test_decode_equals_full_forward(name):
    full, dec, _ = _full_and_decoded(_model(_scheme(name)))
    assert relative_error(dec, full) <= 1e-5, name


def test_fox_decode_with_eviction_keeps_the_evicted_gates():
    """With a sliding window (and left padding in one row) the cache evicts keys and compacts the survivors;
    each key's cumulative gate c_j moves with it and each row's running c continues, so decoding equals the
    full forward and the cache stays bounded."""
    model = _model(_scheme("fox").extend("sliding_window", window=6))
    full, dec, cache = _full_and_decoded(model)
    assert relative_error(dec, full) <= 1e-5
    assert cache.evicted > 0 and cache.length <= model.scheme.mask.bounded_size()
    assert len(cache.gate) == 2 and cache.gate[0].shape[:2] == (2, 4)


def test_fox_cache_refuses_a_mismatched_gate_chunk():
    model = _model(_scheme("fox"))
    cache = KVCache.for_model(model, 1)
    plain = KVCache.for_model(_model(_scheme("alibi")), 1)
    with pytest.raises(ValueError, match="keeps no forget gates"):
        plain.update_gate(0, torch.zeros(1, 4, 1))
    k = torch.zeros(1, 4, 3, 8)
    cache.update(0, k, k, torch.arange(3)[None], None)
    with pytest.raises(ValueError, match="log_f must be"):
        cache.update_gate(0, torch.zeros(1, 4, 2))


# ============================================================================ records, presets, CLI
@pytest.mark.parametrize("name", sorted(TRAINED_METHODS))
def test_trained_records_are_complete_and_build_their_part(name):
    m = TRAINED_METHODS[name]
    assert m.paper.startswith("arXiv:") and m.description.strip() and m.apply is not None
    assert name in TRAINED and TRAINED[name][1] == m.description
    s = PositionScheme.preset(name, train_len=32)
    assert s.name == name and getattr(s, m.sets[0]).kind == name
    assert PositionScheme.from_json(s.to_json()) == s
    for p in m.params:
        assert p.default is not None or p.rule
        assert p.contains(p.default_for(32))


def test_trained_presets_train():
    """One optimizer step moves every learned positional parameter (gradients reach them)."""
    for name in ("cope", "fox", "fire"):
        model = _model(_scheme(name)).train()
        ids = torch.randint(0, 64, (2, 16))
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        own = [(n, p) for n, p in model.named_parameters() if ".gate." in n or ".relative." in n or ".bias." in n]
        assert own and all(p.grad is not None and float(p.grad.abs().max()) > 0 for _, p in own), name


def test_schemes_cli_lists_them_with_papers(capsys):
    from posenc.cli import main

    assert main(["schemes"]) == 0
    out = capsys.readouterr().out
    for name in NEW:
        m = METHODS.get(name) or TRAINED_METHODS[name]
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(name + " "))
        assert m.paper in line, line
