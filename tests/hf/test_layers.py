"""posenc.hf.layers: extend's per-layer rules on transformers families beyond the Llama layout (tiny random models,
nothing downloaded): rope parameters per layer type (Gemma 3), Mistral 3's llama_4_scaling_beta, hybrid
linear-attention models (Qwen3-Next), Llama 4 (complex rotary, NoPE layers, chunked attention, temperature
tuning), MLA (DeepSeek V3, DeepSeek V2's complex rotary), families the compat scan once refused (Beam's NoPE
global layers, NanoChat's -theta rotation, RecurrentGemma's window as trained length, Zamba2's optional RoPE,
GPT-OSS's learned sinks, GPT-J's and CodeGen's rotary_dim of adjacent pairs), sliding windows per layer (a MoE,
shared configs) and the families posenc refuses."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc._util import assert_close  # noqa: E402
from posenc.hf import patch as hf  # noqa: E402

V = 300

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=V, intermediate_size=128, max_position_embeddings=32, pad_token_id=0, bos_token_id=None,
             eos_token_id=None)

MOE = dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           first_k_dense_replace=1)

MLA = dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
           num_key_value_heads=4)


def _gemma3(theta_full=1e6, theta_local=1e4, **kw):
    rp = {"full_attention": {"rope_type": "default", "rope_theta": theta_full},
          "sliding_attention": {"rope_type": "default", "rope_theta": theta_local}}
    return transformers.Gemma3TextConfig, {"layer_types": ["sliding_attention", "full_attention"],
                                           "sliding_window": 6, "rope_parameters": rp, **kw}


def _ministral3(beta=0.5, **kw):
    rp = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
          "beta_fast": 32.0, "beta_slow": 1.0, "llama_4_scaling_beta": beta}
    return transformers.Ministral3Config, {"rope_parameters": rp, "sliding_window": None, **kw}


def _qwen3_next(theta=10000.0, **kw):
    return transformers.Qwen3NextConfig, {
        "layer_types": ["linear_attention", "full_attention"], "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "linear_num_key_heads": 2,
        "linear_num_value_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.5}, **kw}


def _llama4(theta=10000.0, tuning=True, **kw):
    return transformers.Llama4TextConfig, {
        "no_rope_layer_interval": 2, "attention_chunk_size": 8, "attn_temperature_tuning": tuning, "floor_scale": 4,
        "attn_scale": 0.5, "num_local_experts": 2, "num_experts_per_tok": 1, "intermediate_size_mlp": 128,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta}, **kw}


def _deepseek_v3(rope_parameters=None, **kw):
    rp = rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}
    return transformers.DeepseekV3Config, {**MOE, **MLA, "rope_parameters": rp, **kw}


def _deepseek_v2(theta=10000.0, **kw):
    return transformers.DeepseekV2Config, {**MOE, **MLA, "rope_parameters": {"rope_type": "default",
                                                                            "rope_theta": theta}, **kw}


def _gpt_oss(**kw):
    """GPT-OSS: learned attention sinks (s_aux) on every layer, sliding and full layers, YaRN without
    truncation (the published config's rope fields, with the original length shrunk to 8)."""
    rp = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "original_max_position_embeddings": 8,
          "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    return transformers.GptOssConfig, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6,
                                       "num_local_experts": 2, "num_experts_per_tok": 1, "rope_parameters": rp, **kw}


FAMILIES = {"gemma3": _gemma3, "ministral3": _ministral3, "qwen3_next": _qwen3_next, "llama4": _llama4,
            "deepseek_v3": _deepseek_v3, "deepseek_v2": _deepseek_v2, "gpt_oss": _gpt_oss}

INDEXER = dict(index_n_heads=2, index_head_dim=16)  # DeepSeek sparse attention's lightning indexer


def _deepseek_v32(index_topk=2048, **kw):
    return transformers.DeepseekV32Config, {**MOE, **MLA, **INDEXER, "index_topk": index_topk, **kw}


def _glm_moe_dsa(index_topk=2048, **kw):  # layer 1 reuses layer 0's selection ("shared": no indexer of its own)
    return transformers.GlmMoeDsaConfig, {**MOE, **MLA, **INDEXER, "index_topk": index_topk,
                                          "indexer_types": ["full", "shared"], **kw}


DSA = {"deepseek_v32": _deepseek_v32, "glm_moe_dsa": _glm_moe_dsa}  # own tests: the selection matters there


def make_model(family, seed=0, **kw):
    cls, extra = {**FAMILIES, **DSA}[family](**kw)
    args = {**SMALL, **extra}
    if "kv_lora_rank" in args:  # MLA derives its head dims
        args.pop("head_dim")
    cfg = cls(**args)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for mod in model.modules():  # learned sinks start near 0; spread them so they shape the softmax
            if isinstance(getattr(mod, "sinks", None), torch.nn.Parameter):
                mod.sinks.copy_(torch.linspace(-2.0, 3.0, mod.sinks.numel()))
    return model


def prompts(n=24, pad=3):
    x = torch.randint(1, V, (2, n), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(x)
    x[0, :pad], mask[0, :pad] = 0, 0
    return x, mask, (mask.cumsum(-1) - 1).clamp(min=0)  # positions count real tokens, as generate() does


def logits(model, x, mask, pos):
    with torch.no_grad():
        return model(x, attention_mask=mask, position_ids=pos).logits[mask.bool()]


# ===================================================================== every group: none, identity engine, cache
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_none_unchanged_and_engine_identity_equals_transformers(family):
    """"none" is the untouched model; the engine with a method that equals plain RoPE here (ReRoPE with a
    window longer than the sequence) reproduces transformers' logits on a left-padded batch: per-layer-type
    bases, NoPE layers, chunked attention, MLA's rotated slice, complex rotary, Mistral 3's beta scaling."""
    _assert_none_and_engine_logits_equal_transformers(make_model(family))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generate_cache_equals_no_cache(family):
    model = hf.extend(make_model(family), "rerope", window=16)
    x, mask, _ = prompts(n=14)
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False)  # grows to 22 > window
    with torch.no_grad():
        assert torch.equal(model.generate(x, use_cache=True, **kw), model.generate(x, use_cache=False, **kw))


# ===================================================================== features active in the tiny configs
FEATURES = [  # family, config that switches the feature on, config that switches it off
    ("ministral3", {"beta": 0.5}, {"beta": 0.0}),  # q * (1 + beta log(1 + floor(pos / 8)))
    ("llama4", {"tuning": True}, {"tuning": False}),  # NoPE q * (1 + 0.5 log(floor((pos + 1) / 4) + 1))
    ("deepseek_v3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                         "original_max_position_embeddings": 8, "mscale": 1.0,
                                         "mscale_all_dim": 0.5, "beta_fast": 32.0, "beta_slow": 1.0}},
     {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                          "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0}}),
]


@pytest.mark.parametrize("family,on,off", FEATURES, ids=[f for f, _, _ in FEATURES])
def test_position_dependent_scales_equal_transformers(family, on, off):
    """Mistral 3's llama_4_scaling_beta, Llama 4's temperature tuning and DeepSeek YaRN's mscale /
    mscale_all_dim: with positions past original_max_position_embeddings / floor_scale, the engine path
    equals transformers' own output, and the feature changes that output (so it is exercised)."""
    x, mask, pos = prompts()
    model = make_model(family, **on)
    ref = logits(model, x, mask, pos)
    assert not torch.allclose(logits(make_model(family, **off), x, mask, pos), ref, atol=1e-4)
    assert_close(logits(hf.extend(model, "rerope", window=64), x, mask, pos), ref, rtol=1e-4, atol=1e-5)


# ===================================================================== a non-trivial method vs a hand-built reference
def _ntk_theta(theta, rotary_dim, factor=4.0):
    return theta * factor ** (rotary_dim / (rotary_dim - 2))  # base * s^(d/(d-2))


NTK = [  # family, the reference's config: the NTK base written in by hand where the method applies
    ("gemma3", {"theta_full": _ntk_theta(1e6, 16)}),  # global layers only (the default layer_types)
    ("qwen3_next", {"theta": _ntk_theta(1e4, 8)}),  # the one attention layer; partial rotary 0.5 of 16
    ("llama4", {"theta": _ntk_theta(1e4, 16)}),  # the RoPE (chunked) layer; the NoPE layer unchanged
    ("deepseek_v3", {"rope_parameters": {"rope_type": "default", "rope_theta": _ntk_theta(1e4, 8)}}),  # MLA slice
    ("deepseek_v2", {"theta": _ntk_theta(1e4, 8)}),  # MLA slice, complex rotary
]


@pytest.mark.parametrize("family,ref_kw", NTK, ids=[f for f, _ in NTK])
def test_ntk_equals_a_model_with_the_scaled_base(family, ref_kw):
    x, mask, pos = prompts()
    ext = hf.extend(make_model(family), "ntk", native=False, factor=4.0)
    assert_close(logits(ext, x, mask, pos), logits(make_model(family, **ref_kw), x, mask, pos), rtol=1e-4, atol=1e-5)


def test_gemma3_layer_types_choose_the_layers():
    """layer_types=("sliding_attention",) moves NTK to the local layers instead, on a config whose sliding window
    (48) is wider than its trained length (32): its local layers read distances they were not trained on."""
    x, mask, pos = prompts()
    ext = hf.extend(make_model("gemma3", sliding_window=48), "ntk", factor=4.0, layer_types=("sliding_attention",))
    want = logits(make_model("gemma3", sliding_window=48, theta_local=_ntk_theta(1e4, 16)), x, mask, pos)
    assert_close(logits(ext, x, mask, pos), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="not layer types of this model"):
        hf.extend(make_model("gemma3"), "ntk", factor=4.0, layer_types=("chunked_attention",))


@pytest.mark.parametrize("method,params", [("ntk", {"factor": 4.0}), ("selfextend", {"group": 2, "window": 4}),
                                           ("sliding_window", {"window": 12})])
def test_gemma3_a_method_on_local_layers_within_the_trained_length_is_refused(method, params):
    """Local layers of window 6 in a model trained at 32 never read a distance past 5: a method there (a RoPE
    scaling, a remap, a wider window) would change what they were trained on and extend nothing. Refused by
    name, before anything changes; the default (the global layers) is taken."""
    model = make_model("gemma3")
    with pytest.raises(ValueError, match=f"method '{method}' cannot go on layer type 'sliding_attention'.*window "
                                         "of 6 tokens, inside the trained length 32"):
        hf.extend(model, method, layer_types=("sliding_attention", "full_attention"), **params)
    assert model.config._attn_implementation == "eager" and not getattr(model, "_posenc_extended", None)
    assert hf.extend(model, method, **params)._posenc_extended["method"] == method


def test_gemma3_identity_path_equals_transformers():
    """extend(model, "none", native=False): the untouched model with every layer on posenc's engine (the local
    layers' window 6 on the engine's kernels) equals transformers' eager attention on a left-padded batch."""
    x, mask, pos = prompts()
    model = make_model("gemma3")
    want = logits(model, x, mask, pos)
    ext = hf.extend(model, "none", native=False)
    assert ext.config._attn_implementation == "posenc" and ext._posenc_extended["method"] == "none"
    assert_close(logits(ext, x, mask, pos), want, rtol=1e-4, atol=1e-5)
    plain = make_model("gemma3")  # without native=False, "none" is the model as it is
    assert hf.extend(plain, "none") is plain and plain.config._attn_implementation == "eager"


def test_ministral3_sliding_window_equals_transformers_window():
    """Mistral 3 (YaRN + beta scaling kept): posenc's sliding window == transformers' own sliding window."""
    x, mask, pos = prompts()
    ext = hf.extend(make_model("ministral3"), "sliding_window", window=6)
    want = logits(make_model("ministral3", sliding_window=6), x, mask, pos)
    assert_close(logits(ext, x, mask, pos), want, rtol=1e-4, atol=1e-5)


def test_gemma3_native_yarn_on_global_layers():
    """transformers' own YaRN, written into the global layers' rope parameters only."""
    model = hf.extend(make_model("gemma3"), "yarn", factor=4.0)
    rp = model.config.rope_parameters
    assert rp["full_attention"]["rope_type"] == "yarn" and rp["sliding_attention"]["rope_type"] == "default"
    full = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32}
    cls, extra = _gemma3()
    cfg = cls(**{**SMALL, **extra, "rope_parameters": {**extra["rope_parameters"], "full_attention": full}})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    direct = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    x, mask, pos = prompts()
    assert_close(logits(model, x, mask, pos), logits(direct, x, mask, pos), rtol=0, atol=0)


# ===================================================================== save / load
@pytest.mark.parametrize("family", ["gemma3", "ministral3", "qwen3_next", "llama4", "deepseek_v3", "deepseek_v2",
                                    "gpt_oss", "deepseek_v32"])
def test_save_load_round_trip(family, tmp_path):
    kw = {"layer_types": ("sliding_attention", "full_attention")} if family == "gemma3" else {}
    wide = {"sliding_window": 48} if family == "gemma3" else {}  # local layers a method may go on (window > 32)
    model = hf.extend(make_model(family, **wide), "rerope", window=8, **kw)
    hf.save(model, tmp_path / family)
    loaded = hf.load(tmp_path / family)
    assert loaded.config.posenc["method"] == "rerope"
    x, mask, pos = prompts()
    assert_close(logits(loaded, x, mask, pos), logits(model, x, mask, pos), rtol=1e-5, atol=1e-6)


# ===================================================================== refused by posenc, not crashed in transformers
def _refused_models():
    yield "doge", transformers.DogeConfig(**SMALL), "dynamic mask"


@pytest.mark.parametrize("name,cfg,word", list(_refused_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_unsupported_families_refused_with_the_missing_piece(name, cfg, word):
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(ValueError, match=f"{name}.*{word}"):
        hf.extend(model, "rerope", window=16)
    assert getattr(model.config, "posenc", None) is None


# ===================================================================== families once refused
def _built(cls, **kw):
    """A tiny model of ``cls(**kw)``. Pass ``initializer_range=0.1`` where the default 0.02 leaves attention so
    flat that RoPE moves the logits by less than 1e-2 (NanoChat, Zamba2): there a wrong rotation could hide
    under the tolerance."""
    cfg = cls(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _assert_none_and_engine_logits_equal_transformers(model):
    """extend(model, "none") is the untouched model; the engine running plain RoPE (ReRoPE with a window past
    the sequence) reproduces its logits on a left-padded batch. Returns the extended model."""
    x, mask, pos = prompts()
    ref = logits(model, x, mask, pos)
    assert torch.equal(logits(hf.extend(copy.deepcopy(model), "none"), x, mask, pos), ref)
    ext = hf.extend(copy.deepcopy(model), "rerope", window=64)
    assert ext.config._attn_implementation == "posenc"
    assert_close(logits(ext, x, mask, pos), ref, rtol=1e-4, atol=1e-5)
    return ext


def _assert_none_and_engine_equal_transformers(model):
    """The logits check above, and cached greedy decoding equals uncached decoding on the extended model."""
    ext = _assert_none_and_engine_logits_equal_transformers(model)
    x, mask, _ = prompts()
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False)
    with torch.no_grad():
        assert torch.equal(ext.generate(x, use_cache=True, **kw), ext.generate(x, use_cache=False, **kw))
    return ext


def _beam(theta=10000.0):
    rp = {"sliding_attention": {"rope_type": "default", "rope_theta": theta}, "full_attention": None}
    return _built(transformers.BeamConfig, **{**SMALL, "layer_types": ["sliding_attention", "full_attention"],
                                              "sliding_window": 6, "n_routed_experts": 2, "num_experts_per_tok": 1,
                                              "rope_parameters": rp})


def test_beam_default_targets_its_rope_sliding_layers():
    """Beam's global layers are NoPE (with their position-dependent query scale) and its sliding layers have
    RoPE: by default the method goes on the RoPE sliding layers (no global layer has RoPE), the engine
    reproduces both kinds, and NTK there equals a model built with the scaled sliding base."""
    ext = _assert_none_and_engine_equal_transformers(_beam())
    applies = {m.layer_idx: m._posenc["applies"] for m in ext.modules() if hasattr(m, "_posenc")}
    assert applies == {0: True, 1: False}
    x, mask, pos = prompts()
    ntk = hf.extend(_beam(), "ntk", factor=4.0)
    assert_close(logits(ntk, x, mask, pos), logits(_beam(_ntk_theta(1e4, 16)), x, mask, pos), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="applies to no attention layer with RoPE"):  # an explicit choice stays
        hf.extend(_beam(), "rerope", window=16, layer_types=("full_attention",))


def test_nanochat_negative_rotation_as_half_swapped_q_and_k():
    """NanoChat's rotate_half is cat(x2, -x1): a rotation by -theta. The probe finds it and the engine runs on
    half-swapped q and k (R(-theta) = S R(theta) S), which reproduces transformers' logits."""
    cfg = {k: v for k, v in SMALL.items() if k != "eos_token_id"}
    model = _built(transformers.NanoChatConfig, **cfg, initializer_range=0.1)
    ext = _assert_none_and_engine_equal_transformers(model)
    assert hf.posenc_scheme(ext).rope.layout == "half"
    assert all(m._posenc_swap_halves for m in ext.modules() if hasattr(m, "_posenc"))


def test_unrecognised_rotation_refused(monkeypatch):
    """A family whose apply_rotary_pos_emb rotates by none of +theta (half or interleaved) or -theta (half) is
    refused rather than run with a different rotation (here NanoChat's module rotating by 2 theta)."""
    import transformers.models.nanochat.modeling_nanochat as nanochat

    own = nanochat.apply_rotary_pos_emb

    def doubled(q, k, cos, sin, **kw):
        return own(*own(q, k, cos, sin, **kw), cos, sin, **kw)

    monkeypatch.setattr(nanochat, "apply_rotary_pos_emb", doubled)
    model = _built(transformers.NanoChatConfig, **{k: v for k, v in SMALL.items() if k != "eos_token_id"})
    with pytest.raises(ValueError, match="nanochat.*neither half nor interleaved"):
        hf.extend(model, "rerope", window=16)


def test_recurrent_gemma_trained_length_is_its_attention_window():
    """RecurrentGemma's config has no max_position_embeddings; its attention is local only, so its trained
    length is the window (the largest relative distance it attended over); the engine reproduces its
    partial-rotary local attention layer next to the recurrent one."""
    model = _built(transformers.RecurrentGemmaConfig, hidden_size=64, lru_width=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=V,
                   block_types=["recurrent", "attention"], attention_window_size=8, pad_token_id=0)
    assert hf.train_len_of(model.config) == 8
    ext = _assert_none_and_engine_equal_transformers(model)
    assert hf.posenc_scheme(ext).train_len == 8


def test_zamba2_shared_attention_rope():
    """Zamba2 with use_mem_rope (RoPE in its shared attention blocks, off by default): the engine reproduces
    the hybrid (Mamba 2 + shared attention) model."""
    model = _built(transformers.Zamba2Config, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=128, vocab_size=V, mamba_d_state=16,
                   layers_block_type=["linear_attention", "hybrid"], use_mem_rope=True, max_position_embeddings=32,
                   initializer_range=0.1)
    _assert_none_and_engine_equal_transformers(model)


# ===================================================================== partial rotary with an attention factor
@pytest.mark.parametrize("cls,kw", [(transformers.GPTNeoXConfig, {"rotary_pct": 0.5}),
                                    (transformers.Phi3Config, {"partial_rotary_factor": 0.5})],
                         ids=["gpt_neox", "phi3"])
def test_partial_rotary_yarn_scales_only_the_rotated_dims_as_transformers(cls, kw):
    """transformers multiplies cos/sin by YaRN's attention factor: the pass-through dims of a partial-rotary
    head keep their scale. posenc's YaRN (native=False) equals transformers' YaRN there too."""
    def model(method, **p):
        cfg = cls(**{**SMALL, "max_position_embeddings": 16, **kw})
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        return hf.extend(transformers.AutoModelForCausalLM.from_config(cfg).eval(), method, **p)

    x, mask, pos = prompts()
    ours, theirs = model("yarn", native=False, factor=4.0), model("yarn", factor=4.0)
    assert_close(logits(ours, x, mask, pos), logits(theirs, x, mask, pos), rtol=1e-4, atol=1e-5)


# ===================================================================== interleaved pairs without complex numbers
@pytest.mark.parametrize("cls,kw", [(transformers.CohereConfig, {}),
                                    (transformers.Glm4Config, {"partial_rotary_factor": 0.5})],
                         ids=["cohere", "glm4"])
def test_interleaved_rotation_probed_from_the_family(cls, kw):
    """Cohere and GLM 4 rotate adjacent pairs (GLM 4 on half the head): the layout is read off the family's
    own apply_rotary_pos_emb, and the engine path equals transformers; NTK equals the scaled base."""
    def model(theta=10000.0):
        cfg = cls(**{**SMALL, "rope_parameters": {"rope_type": "default", "rope_theta": theta}, **kw})
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(cfg).eval()

    x, mask, pos = prompts()
    ext = hf.extend(model(), "rerope", window=64)
    assert hf.posenc_scheme(ext).rope.layout == "interleaved"
    assert_close(logits(ext, x, mask, pos), logits(model(), x, mask, pos), rtol=1e-4, atol=1e-5)
    rd = 16 if cls is transformers.CohereConfig else 8
    ntk = hf.extend(model(), "ntk", factor=4.0)
    assert_close(logits(ntk, x, mask, pos), logits(model(_ntk_theta(1e4, rd)), x, mask, pos), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", ["gptj", "codegen"])
def test_rotate_every_two_on_rotary_dim_read_from_the_family(family):
    """GPT-J and CodeGen rotate adjacent pairs (``rotate_every_two``) of the first ``rotary_dim`` dims of each
    head (a config field, no partial_rotary_factor), by ``(sin, cos)`` their rotary module returns sin first
    and their ``apply_rotary_pos_emb(tensor, sin, cos)`` takes one tensor. Read as half pairs on the whole
    head, posenc's engine running plain RoPE differed from the model by 3e-3 (GPT-J) and 5e-3 (CodeGen)."""
    from posenc.hf import compat
    from posenc.hf.layers import sin_first

    model = compat.build_tiny(family)
    assert model.config.rotary_dim == 4 and model.config.hidden_size // model.config.num_attention_heads == 16
    assert sin_first(model.transformer.rotary_emb)
    ids, mask = compat.left_padded_batch(int(model.config.vocab_size))
    assert compat.rope_difference(model, ids, mask) < 1e-5
    ext = hf.extend(copy.deepcopy(model), "rerope", window=48)
    rope = hf.posenc_scheme(ext).rope
    assert (rope.layout, rope.partial_rotary_factor) == ("interleaved", 0.25)
    with torch.no_grad():  # the hook's identity is (sin, cos) = (0, 1): q and k reach attention un-rotated
        sin, cos = ext.transformer.rotary_emb(torch.zeros(1, 1, 1), torch.arange(5)[None])
    assert not sin.any() and bool((cos == 1).all())
    published = type(model.config)(n_embd=4096, n_head=16, rotary_dim=64)  # GPT-J-6B, CodeGen: 64 of 256
    assert hf.scheme_from_config(published).rope.partial_rotary_factor == 0.25
    m3 = transformers.MiniMaxM3VLTextConfig()  # a rotary_dim its model never reads: rope_parameters decide
    assert m3.rotary_dim == 64 and hf.scheme_from_config(m3).rope.partial_rotary_factor == 1.0


def test_hybrid_without_attention_layers_refused_by_posenc():
    """A hybrid whose layers are all linear attention has no RoPE attention: posenc says so (transformers'
    own cache cannot tell its sequence length there: get_seq_length needs an attention layer)."""
    model = make_model("qwen3_next", layer_types=["linear_attention", "linear_attention"])
    with pytest.raises(ValueError, match="no attention layers"):
        hf.extend(model, "rerope", window=16)


def test_deepseek_native_yarn_equals_a_model_built_with_it():
    """transformers' own YaRN on DeepSeek V3, mscale_all_dim included: the attention modules' softmax scale
    (computed from rope_parameters when transformers builds them) follows the new parameters."""
    yarn = {"factor": 4.0, "original_max_position_embeddings": 8, "mscale": 1.0, "mscale_all_dim": 0.5,
            "beta_fast": 32.0, "beta_slow": 1.0}
    ext = hf.extend(make_model("deepseek_v3"), "yarn", **yarn)
    direct = make_model("deepseek_v3", rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, **yarn})
    x, mask, pos = prompts()
    assert_close(logits(ext, x, mask, pos), logits(direct, x, mask, pos), rtol=0, atol=0)


def test_partial_rotary_dynamic_schedule_cached_equals_uncached():
    """Dynamic YaRN on a partial-rotary head: the pass-through dims are rescaled per query (the factor of
    each query's own schedule length), the same in a full forward and in cached decoding."""
    cfg = transformers.Phi3Config(**{**SMALL, "max_position_embeddings": 16, "partial_rotary_factor": 0.5})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = hf.extend(transformers.AutoModelForCausalLM.from_config(cfg).eval(), "dynamic_yarn")
    x, mask, _ = prompts(n=14)
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False)  # grows to 22 > 16
    with torch.no_grad():
        assert torch.equal(model.generate(x, use_cache=True, **kw), model.generate(x, use_cache=False, **kw))


def test_attention_outside_the_interface_refused():
    """GPT-NeoX-Japanese computes attention in its own ``_attn``: posenc's attention function would never
    run, so extend refuses it instead of leaving the model without rotation."""
    cfg = transformers.GPTNeoXJapaneseConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                             intermediate_multiple_size=2, vocab_size=V)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(ValueError, match="gpt_neox_japanese.*AttentionInterface"):
        hf.extend(model, "rerope", window=16)
    hf.extend(model, "yarn", factor=2.0)  # transformers' own methods need no attention function


# ===================================================================== NoPE layers decided inside forward
@pytest.mark.parametrize("family", ["exaone4", "afmoe"])
def test_nope_layers_decided_in_forward_are_not_rotated(family):
    """EXAONE 4 (``if self.sliding_window is None or self.is_sliding:``) and AFMoE (``if
    self.is_local_attention:``) rotate only their sliding layers: posenc reads that test from the forward
    source per layer, so its engine running plain RoPE reproduces the model (it differed by ~0.2 when the
    global layers were rotated)."""
    from posenc.hf import compat
    from posenc.hf.layers import rotates_in_forward

    model = compat.build_tiny(family)
    layer_types = model.config.layer_types
    attn = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    assert [rotates_in_forward(m) for m in attn] == [t == "sliding_attention" for t in layer_types]
    assert {"sliding_attention", "full_attention"} <= set(layer_types)
    ids, mask = compat.left_padded_batch(int(model.config.vocab_size))
    assert compat.rope_difference(model, ids, mask) < 1e-5


def test_rope_condition_on_other_names_counts_as_rotating():
    """A test on anything but ``self`` (``position_embeddings is not None``) is not evaluated: the rotation runs."""
    from posenc.hf.layers import rotates_in_forward

    class Plain(torch.nn.Module):
        def forward(self, x, position_embeddings=None):
            if position_embeddings is not None:
                x = apply_rotary_pos_emb(x, x, *position_embeddings)  # noqa: F821 - read, never run
            return x

    class Global(torch.nn.Module):
        is_local = False

        def forward(self, x):
            if self.is_local:
                x = apply_rotary_pos_emb(x, x, None, None)  # noqa: F821
            return x

    class NoCall(torch.nn.Module):
        def forward(self, x):
            return x

    class SharedKV(torch.nn.Module):  # Gemma 3n: q always rotated, k only where the layer makes its own
        is_kv_shared_layer = True

        def forward(self, x, shared):
            q = apply_rotary_pos_emb(x, None, None)  # noqa: F821
            if self.is_kv_shared_layer:
                k = shared
            else:
                k = apply_rotary_pos_emb(x, None, None)  # noqa: F821
            return q, k

    assert rotates_in_forward(Plain()) is True and rotates_in_forward(Global()) is False
    assert rotates_in_forward(SharedKV()) is True
    assert rotates_in_forward(NoCall()) is None

LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, vocab_size=128, max_position_embeddings=64, pad_token_id=0)


def _llama(cfg=None):
    torch.manual_seed(0)
    cfg = cfg or transformers.LlamaConfig(**LLAMA)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _prompts():
    x = torch.randint(1, 128, (2, 80), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(x)
    x[1, :10], mask[1, :10] = 0, 0  # the second prompt left-padded by 10
    return x, mask


def _cached_equals_uncached(model):
    x, mask = _prompts()
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        return torch.equal(model.generate(x, use_cache=True, **kw), model.generate(x, use_cache=False, **kw))


# ===================================================================== item 4: sliding-window layers
def test_phimoe_sliding_window_cached_equals_uncached():
    """Phi-MoE's attention ignores sliding_window (only its mask and its cache apply it): the engine path
    takes each layer's window from the config as transformers' cache does."""
    cfg = transformers.PhimoeConfig(**LLAMA, sliding_window=32, num_local_experts=4, num_experts_per_tok=2)
    model = hf.extend(_llama(cfg), "rerope", window=16)
    assert {m._posenc_window for m in hf._attention_modules(model)} == {32}
    assert _cached_equals_uncached(model)


def test_mistral_sliding_window_control():
    cfg = transformers.MistralConfig(**LLAMA, sliding_window=32)
    assert _cached_equals_uncached(hf.extend(_llama(cfg), "rerope", window=16))


def test_moshi_decoder_sliding_window_cached_equals_uncached():
    cfg = transformers.MoshiConfig(**LLAMA, sliding_window=32, audio_vocab_size=32, num_codebooks=2,
                                   depth_hidden_size=32, depth_num_hidden_layers=1, depth_num_attention_heads=2,
                                   depth_ffn_dim=64)
    torch.manual_seed(0)
    model = hf.extend(transformers.MoshiForCausalLM(cfg).eval(), "rerope", window=16)
    assert _cached_equals_uncached(model)


def test_layer_window_follows_layer_types():
    cfg = transformers.Gemma2Config(**LLAMA, sliding_window=6)
    model = hf.extend(_llama(cfg), "rerope")
    assert [m._posenc_window for m in hf._attention_modules(model)] == [6, None]  # sliding, full
    assert [m._posenc_window for m in hf._attention_modules(hf.extend(_llama(), "rerope"))] == [None, None]
