"""posenc.hf.tiny: tiny configs of real published configs (tests/fixtures/hf_configs/) keep their position fields,
both layer kinds of a hybrid, the producers of a KV-sharing model, and shrink per-layer overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from posenc.hf import compat  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"

NAMES = sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.mark.parametrize("name", NAMES)
def test_tiny_config_keeps_the_real_position_fields(name):
    fields = compat.load_fixture(FIXTURES / f"{name}.json")
    full = transformers.AutoConfig.for_model(
        fields["model_type"], **{k: v for k, v in fields.items() if k not in ("_source", "model_type")
                                 and k not in compat.LEGACY_FIELD_TYPES})
    tiny = compat.tiny_from_fixture(FIXTURES / f"{name}.json")
    assert tiny.num_hidden_layers == 2 and tiny.num_attention_heads == 4 and tiny.vocab_size == 256
    for key in ("rope_parameters", "head_dim", "sliding_window", "max_position_embeddings", "query_pre_attn_scalar",
                "original_max_position_embeddings", "attention_chunk_size", "qk_rope_head_dim"):
        assert getattr(tiny, key, None) == getattr(full, key, None), key
    if getattr(full, "head_dim", None) is None:  # head_dim derived from hidden / heads: that ratio is kept
        assert tiny.hidden_size // tiny.num_attention_heads == full.hidden_size // full.num_attention_heads
    for key in ("layer_types", "no_rope_layers"):  # every kind of layer the real model has, in 2 layers
        if isinstance(getattr(full, key, None), list):
            assert set(getattr(tiny, key)) == set(getattr(full, key)), key


def test_longrope_fixture_keeps_the_full_factor_lists():
    tiny = compat.tiny_from_fixture(FIXTURES / "phi-3.5-mini-instruct.json")
    rp = tiny.rope_parameters
    assert len(rp["long_factor"]) == len(rp["short_factor"]) == 48 == (tiny.hidden_size // 4) // 2
    assert rp["long_factor"][-1] == 64.83999633789062 and rp["short_factor"][0] == 1.0


# ===================================================================== the scan
def test_tiny_config_keeps_both_layer_kinds():
    tiny = compat.tiny_config(transformers.Gemma3TextConfig)
    assert tiny.layer_types == ["sliding_attention", "full_attention"]
    assert (tiny.hidden_size, tiny.num_hidden_layers, tiny.head_dim, tiny.num_key_value_heads) == (64, 2, 16, 2)
    mla = compat.tiny_config(transformers.DeepseekV3Config)
    assert mla.num_key_value_heads == mla.num_attention_heads == 4 and mla.n_routed_experts == 4


def _n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_tiny_hybrid_keeps_an_attention_layer_with_rope():
    """GraniteMoeHybrid's default config is all Mamba layers with RoPE off: the tiny one keeps an
    attention layer, turns RoPE on, and shrinks the shared expert (1024 wide before)."""
    tiny = compat.tiny_config(transformers.GraniteMoeHybridConfig)
    assert tiny.layer_types == ["linear_attention", "full_attention"]
    assert tiny.position_embedding_type == "rope" and tiny.shared_intermediate_size == 32
    model = compat.build_tiny("granitemoehybrid")
    assert [layer.self_attn is not None for layer in model.model.layers] == [False, True]
    assert model.model.rotary_emb is not None and _n_params(model) <= compat.MAX_PARAMS


def test_tiny_kv_sharing_model_keeps_producers_of_both_layer_types():
    """Gemma 3n's last 15 of 35 layers reuse earlier caches: the tiny model is the 2 kept layers and
    one sharing layer of each type after them (2 layers with 15 shared could not be built)."""
    tiny = compat.tiny_config(transformers.Gemma3nTextConfig)
    kinds = ["sliding_attention", "full_attention"]
    assert tiny.layer_types == kinds + kinds and tiny.num_hidden_layers == 4 and tiny.num_kv_shared_layers == 2
    assert tiny.kv_sharing_modes == ["store", "store", "reuse", "reuse"]
    assert len(tiny.intermediate_size) == len(tiny.activation_sparsity_pattern) == 4
    assert tiny.vocab_size_per_layer_input == 256  # 262,144 x 35 x 256 per-layer embeddings before
    assert _n_params(compat.build_tiny("gemma3n")) <= compat.MAX_PARAMS


def test_tiny_per_layer_overrides_and_aliased_sizes_shrink():
    """Gemma 4's full-attention layers override head_dim (512 over 256): the override shrinks at its
    ratio; dots3's sliding-window MLA override shrinks to the tiny MLA shape it must satisfy; DBRX's
    sizes under attribute_map aliases (d_model, n_layers) shrink; 0 (no shared expert) stays 0."""
    g4 = compat.tiny_config(transformers.Gemma4TextConfig)
    assert g4.layer_types == ["sliding_attention", "full_attention"]
    assert (g4.per_layer_config[0].head_dim, g4.per_layer_config[1].head_dim) == (16, 32)
    dots = compat.tiny_config(transformers.Dots3NoteTextConfig)
    swa = dots.per_layer_config[dots.layer_types.index("sliding_attention")]
    assert swa.head_dim == swa.qk_nope_head_dim + swa.qk_rope_head_dim == 16 and swa.kv_lora_rank == 16
    dbrx = compat.tiny_config(transformers.DbrxConfig)
    assert (dbrx.d_model, dbrx.n_layers, dbrx.n_heads, dbrx.ffn_config.hidden_size) == (64, 2, 4, 64)
    assert compat.tiny_config(transformers.GraniteMoeSharedConfig).shared_intermediate_size == 0
    for family in ("gemma4", "dots3_note", "dbrx"):
        assert _n_params(compat.build_tiny(family)) <= compat.MAX_PARAMS, family


def test_tiny_dory_keeps_its_sections_inside_the_model():
    """Dory's input / recurrent / output sections (8 / 20 / 8 layers, each stored as attention + mlp blocks)
    overran the 2 tiny layers (1 left, in sections of 4: run twice into one cache, its attention failed on a
    mask of half the keys): the tiny model has a sliding input layer and a looped full-attention layer, and
    posenc's engine reproduces it."""
    tiny = compat.tiny_config(transformers.DoryConfig)
    assert tiny.layer_types == ["sliding_attention", "full_attention"] and tiny.num_hidden_layers == 2
    assert (tiny.n_input_layers, tiny.n_recurrent_layers, tiny.n_output_layers, tiny.n_recurrent_loops) == (1, 1, 0, 2)
    assert compat.check_model(compat.build_tiny("dory")) < 1e-5
