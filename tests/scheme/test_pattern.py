"""Layer patterns (posenc.scheme.pattern, PositionScheme.layers): the irope / local_global / nope_every4 presets,
hand-built patterns, methods on chosen layers, training, cached decoding, checkpoints, and Llama 4's NoPE +
temperature layers against a dense reference and transformers."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from posenc import LMConfig, PositionScheme, TinyLM
from posenc._util import assert_close, relative_error
from posenc.engine import PositionalAttention
from posenc.models.cache import KVCache
from posenc.parts.masks import MaskSpec
from posenc.scheme.core import RopeSpec
from posenc.scheme.part import Part

P = PositionScheme


# ---------------------------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", ["irope", "local_global", "nope_every4"])
def test_a_pattern_preset_takes_an_integral_float_period(name):
    assert P.preset(name, train_len=64, every=2.0) == P.preset(name, train_len=64, every=2)
    with pytest.raises(ValueError, match=rf"{name}.every must be an integer >= 1, got 2.5"):
        P.preset(name, train_len=64, every=2.5)
    assert P.preset("irope", train_len=64, chunk=16.0) == P.preset("irope", train_len=64, chunk=16)

L = 16

PATTERNS = {"irope": {"every": 2}, "local_global": {"every": 2}, "nope_every4": {"every": 2}}


def pattern(name, **kw):
    return PositionScheme.preset(name, train_len=L, **{**PATTERNS[name], **kw})


def pattern_model(scheme, n_layers=4, seed=0, dim=32):
    torch.manual_seed(seed)
    return TinyLM(LMConfig(vocab_size=64, dim=dim, n_layers=n_layers, n_heads=4, scheme=scheme, train_len=L)).eval()


def names(model):
    return [b.attn.scheme.name for b in model.blocks]


# ===================================================================== presets and config
def test_presets_build_the_documented_layers():
    assert [s.name for s in PositionScheme.preset("irope", train_len=64).layers] == \
        ["rope_chunked"] * 3 + ["nope_temperature"]
    ir = PositionScheme.preset("irope", train_len=64).layers
    assert ir[0].mask.chunk == 16 and ir[0].rope is not None and ir[3].rope is None and ir[3].mask == MaskSpec()
    assert dict(ir[3].temperature.params) == {"attn_scale": 0.1, "floor_scale": 16.0}
    lg = PositionScheme.preset("local_global", train_len=64).layers
    assert len(lg) == 6 and [s.rope.base for s in lg] == [1e4] * 5 + [1e6]
    assert [s.mask.window for s in lg] == [16] * 5 + [None]
    nope = PositionScheme.preset("nope_every4", train_len=64).layers
    assert [s.rope is None for s in nope] == [False, False, False, True]
    # transformers' rule: layer i is special when (i + 1) % every == 0, and the pattern repeats
    m = pattern_model(PositionScheme.preset("nope_every4", train_len=L), n_layers=8)
    assert [i for i, b in enumerate(m.blocks) if b.attn.scheme.rope is None] == [3, 7]


def test_plain_schemes_keep_their_json():
    d = PositionScheme.preset("rope", train_len=L).to_dict()
    assert "layers" not in d and "temperature" not in d and "chunk" not in d["mask"]
    cfg = LMConfig(64, 32, 2, 4, PositionScheme.preset("rope", train_len=L), L)
    assert cfg.layer_schemes == (cfg.scheme, cfg.scheme)


def test_a_hand_built_pattern():
    rope = PositionScheme.preset("rope", train_len=L)
    s = PositionScheme(name="mine", train_len=L, layers=[rope, PositionScheme.preset("alibi", train_len=L)])
    assert isinstance(s.layers, tuple) and PositionScheme.from_json(s.to_json()) == s
    m = pattern_model(s, n_layers=3)
    assert names(m) == ["rope", "alibi", "rope"] and s.layer(5).name == "alibi"


@pytest.mark.parametrize("make, match", [
    (lambda: LMConfig(64, 32, 2, 4, PositionScheme.preset("irope", train_len=L), L), "more than n_layers=2"),
    (lambda: PositionScheme(layers=()), "non-empty"),
    (lambda: PositionScheme(layers=("rope",)), r"layers\[0\] must be a PositionScheme"),
    (lambda: PositionScheme(layers=(PositionScheme.preset("learned", train_len=L),)), "embedding is added once"),
    (lambda: PositionScheme(layers=(PositionScheme.preset("infini", train_len=L),)), "carries memory"),
    (lambda: PositionScheme(layers=(pattern("irope"),)), "do not nest"),
    (lambda: PositionScheme(rope=RopeSpec(), layers=(PositionScheme(),)), r"sets \['rope'\] on itself"),
    (lambda: PositionScheme.from_dict({"layers": {"a": 1}}), "list of scheme dicts"),
    (lambda: PositionScheme.preset("irope", train_len=L, every=1), "every must be >= 2"),
    (lambda: PositionScheme.preset("irope"), "needs train_len or chunk"),
    (lambda: PositionScheme.preset("irope", train_len=L, floor_scale=0), "floor_scale"),
    (lambda: PositionScheme.preset("irope", train_len=L, chunk=0), "chunk"),
    (lambda: PositionScheme.preset("local_global", window=0), "window"),
    (lambda: PositionalAttention(32, 4, pattern("irope")), "layer pattern"),
    (lambda: MaskSpec(chunk=0), "mask.chunk"),
    (lambda: PositionScheme(temperature=Part("llama4", {"floor_scale": 0.0})), "floor_scale"),
    (lambda: PositionScheme(temperature=Part("llama5")), "temperature kind"),
    (lambda: PositionScheme.preset("rope", train_len=L).extend("yarn", factor=2, layers=[0]), "layer pattern"),
    (lambda: pattern("irope").extend("yarn", factor=2, layers=[2]), r"indices in \[0, 2\)"),
    (lambda: pattern("irope").extend("yarn", factor=2, layers=[True]), "indices"),
    (lambda: PositionScheme(layers=(PositionScheme(),)).extend("yarn", factor=2), "no RoPE layer"),
])
def test_bad_patterns_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ===================================================================== training, cache, methods
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_each_pattern_trains(name):
    torch.manual_seed(0)
    m = pattern_model(pattern(name)).train()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    ids = torch.randint(0, 64, (4, L + 1))
    losses = []
    for _ in range(4):
        logits = m(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("name", sorted(PATTERNS) + ["irope_long"])
def test_cached_decode_equals_full_forward(name):
    scheme = PositionScheme.preset("irope", train_len=L, chunk=6, floor_scale=4.0) if name == "irope_long" \
        else pattern(name)
    m = pattern_model(scheme)
    ids = torch.randint(0, 64, (2, 3 * L))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        full = m(ids, positions=pos, attention_mask=mask)
        cache = KVCache.for_model(m, 2)
        outs = [m(ids[:, :10], positions=pos[:, :10], cache=cache, attention_mask=mask[:, :10])]
        outs += [m(ids[:, t:t + 1], cache=cache) for t in range(10, ids.shape[1])]
    real = mask.bool()
    assert relative_error(torch.cat(outs, 1)[real], full[real]) <= 1e-5


def _attention_outputs(model, x, positions):
    """Each block's attention output on the same input ``x`` (so a layer's change cannot leak into others)."""
    with torch.no_grad():
        return [b.attn(b.norm1(x), positions) for b in model.blocks]


@pytest.mark.parametrize("name", ["nope_every4", "irope"])
def test_methods_apply_to_rope_layers_only(name):
    m = pattern_model(pattern(name))
    x, pos = torch.randn(2, 4 * L, 32), torch.arange(4 * L)[None].expand(2, -1)
    before = _attention_outputs(m, x, pos)
    yarn = m.with_scheme("yarn", factor=4)
    after = _attention_outputs(yarn, x, pos)
    for blk, a, b in zip(m.blocks, before, after):
        if blk.attn.scheme.rope is None:
            assert torch.equal(a, b)  # NoPE layers (and Llama 4's temperature) untouched
        else:
            assert relative_error(b, a) > 1e-3
    assert yarn.scheme.name == f"{name}:yarn"
    assert all(s.rope is None or s.rope.scaling["rope_type"] == "yarn" for s in yarn.cfg.layer_schemes)


def test_methods_apply_to_the_chosen_model_layers():
    m = pattern_model(pattern("nope_every4"))  # rope, nope, rope, nope
    x, pos = torch.randn(2, 4 * L, 32), torch.arange(4 * L)[None].expand(2, -1)
    before = _attention_outputs(m, x, pos)
    only2 = m.with_scheme("yarn", factor=4, layers=[2])
    assert names(only2) == ["rope", "nope", "yarn", "nope"]
    after = _attention_outputs(only2, x, pos)
    assert [torch.equal(a, b) for a, b in zip(before, after)] == [True, True, False, True]
    # a single scheme becomes a per-layer pattern; a mask method can go to a NoPE layer when named
    plain = pattern_model(PositionScheme.preset("rope", train_len=L), n_layers=3)
    assert names(plain.with_scheme("rerope", layers=[0, 2])) == ["rerope", "rope", "rerope"]
    windowed = m.with_scheme("sliding_window", window=4, layers=[1])
    assert names(windowed) == ["rope", "nope:sliding_window", "rope", "nope"]
    with pytest.raises(ValueError, match="only accepted with a method name"):
        m.with_scheme(pattern("nope_every4"), layers=[0])


def test_an_embedding_method_applies_to_the_pattern_embedding():
    s = replace(pattern("nope_every4"), embedding=Part("learned", {"max_positions": L}))
    m = pattern_model(s)
    h = m.with_scheme("hierarchical")
    assert h.scheme.embedding.kind == "hierarchical" and h.cfg.layer_schemes == m.cfg.layer_schemes
    assert h.scheme.max_positions == L * L
    with pytest.raises(ValueError, match="without layers="):
        s.extend("hierarchical", layers=[0])


def test_checkpoint_round_trip(tmp_path):
    from posenc.models.checkpoint import load_model, save_checkpoint

    m = pattern_model(pattern("irope"))
    save_checkpoint(tmp_path / "run", m, m.cfg)
    again = load_model(tmp_path / "run")
    assert again.cfg == m.cfg and names(again) == names(m)
    ids = torch.randint(0, 64, (2, 2 * L))
    with torch.no_grad():
        assert torch.equal(again(ids), m(ids))


def _dense_reference(attn, x, positions, allowed, q_mult=None, rope_base=None):
    """softmax(q k^T / sqrt(d) masked) v through the projections, RoPE (rotate-half) written out here."""
    q, k, v = attn.project(x)
    d = q.shape[-1]
    if rope_base is not None:
        inv = 1.0 / rope_base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = positions[:, None, :, None].double() * inv  # [B,1,N,d/2]
        cos, sin = torch.cat([ang.cos()] * 2, -1).float(), torch.cat([ang.sin()] * 2, -1).float()

        def rot(t):
            return t * cos + torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1) * sin

        q, k = rot(q), rot(k)
    if q_mult is not None:
        q = q * q_mult[:, None, :, None].float()
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.softmax(s, -1) @ v  # [B,H,N,D]
    B, H, N, D = out.shape
    return attn.o_proj(out.transpose(1, 2).reshape(B, N, H * D))


def test_nope_temperature_layer_equals_a_dense_reference():
    torch.manual_seed(0)
    layer = PositionScheme.preset("irope", train_len=L, every=2, floor_scale=3.0, attn_scale=0.5).layers[1]
    attn = PositionalAttention(32, 4, layer)
    x, pos = torch.randn(2, 20, 32), torch.arange(20)[None].expand(2, -1)
    mult = 1 + 0.5 * torch.log1p(torch.floor((pos + 1.0) / 3.0))
    with torch.no_grad():
        assert_close(attn(x, pos), _dense_reference(attn, x, pos, pos[:, None, :] <= pos[:, :, None], q_mult=mult),
                     rtol=1e-4, atol=1e-5)


def test_nope_temperature_layer_equals_transformers_llama4():
    """posenc's NoPE + temperature layer against transformers' ``Llama4TextAttention`` (a NoPE layer with
    ``attn_temperature_tuning``) on the same weights and inputs."""
    pytest.importorskip("transformers")
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    cfg = Llama4TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           num_hidden_layers=1, no_rope_layers=[0], attn_temperature_tuning=True, attn_scale=0.3,
                           floor_scale=4, use_qk_norm=False, attention_bias=False, intermediate_size=16,
                           intermediate_size_mlp=16, vocab_size=16)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = Llama4TextAttention(cfg, 0).eval()
    layer = PositionScheme.preset("irope", train_len=L, every=2, floor_scale=4.0, attn_scale=0.3).layers[1]
    ours = PositionalAttention(32, 4, layer, n_kv_heads=2)
    ours.load_state_dict({f"{n}.weight": getattr(ref, n).weight for n in ("q_proj", "k_proj", "v_proj", "o_proj")},
                         strict=False)
    N = 19
    x = torch.randn(2, N, 32)
    causal = torch.full((N, N), float("-inf")).triu(1)[None, None].expand(2, 1, N, N)
    with torch.no_grad():
        want, _ = ref(x, position_embeddings=None, attention_mask=causal)
        assert_close(ours(x), want, rtol=1e-4, atol=1e-5)


def test_irope_equals_transformers_llama4():
    """A TinyLM under ``irope`` (interleaved RoPE, as Llama 4) against a dense ``Llama4ForCausalLM`` (no MoE
    layers, no q/k L2 norm) with the same weights: chunked RoPE layers, NoPE layers with temperature tuning."""
    pytest.importorskip("transformers")
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    chunk = 5
    s = PositionScheme.preset("irope", train_len=L, every=2, chunk=chunk, floor_scale=3.0, layout="interleaved")
    m = pattern_model(s)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3)
    cfg = Llama4TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=16, intermediate_size_mlp=m.cfg.mlp_hidden,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, head_dim=8, rms_norm_eps=1e-6,
        moe_layers=[], use_qk_norm=False, no_rope_layers=[1, 0, 1, 0], attention_chunk_size=chunk,
        attn_temperature_tuning=True, floor_scale=3, attn_scale=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        pad_token_id=None, bos_token_id=None, eos_token_id=None)
    cfg._attn_implementation = "eager"
    hf = Llama4ForCausalLM(cfg).eval()
    rename = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm", "attn": "self_attn",
              "mlp": "feed_forward"}
    weights = {"model.embed_tokens.weight": m.tok.weight, "model.norm.weight": m.norm.weight}
    for k, v in m.blocks.state_dict().items():
        i, *rest = k.split(".")
        weights[f"model.layers.{i}." + ".".join(rename.get(p, p) for p in rest)] = v
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    assert not unexpected and missing == ["lm_head.weight"]
    ids = torch.randint(0, 64, (2, 23))
    with torch.no_grad():
        assert relative_error(hf(ids).logits, m(ids)) <= 1e-5
