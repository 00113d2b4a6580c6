"""Tiny configs of transformers model families for :mod:`posenc.hf.compat`: :func:`tiny_config` shrinks a
family's own default config (:data:`TINY_SIZES` on every size field it has, also through its
``attribute_map`` aliases; per-layer lists cut to :data:`N_LAYERS` layers that keep every distinct layer
type; per-layer overrides, MoE, MLA and sub-configs shrunk; :data:`FAMILY_OVERRIDES` where a family's
defaults do not build), keeping what decides positions (rope parameters, layer-type patterns, partial
rotary dims kept even)."""

from __future__ import annotations

# ----------------------------------------------------------------------------- tiny sizes
# field -> tiny value, applied to every field a config class has (its to_dict() keys)
TINY_SIZES = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 128, "vocab_size": 256,
    # mixture of experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "top_k": 2, "num_experts_per_token": 2, "moe_k": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "expert_intermediate_size": 32,
    "intermediate_size_mlp": 128, "ffn_hidden_size": 128, "moe_ffn_hidden_size": 32,
    "n_shared_experts": 1, "num_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "decoder_sparse_step": 1, "expert_ffn_hidden_size": 32, "num_layers": 2,
    # multi-head latent attention
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    # vision / audio towers of sub-configs
    "depth": 2, "num_heads": 4, "embed_dim": 64, "out_hidden_size": 64, "projection_dim": 64,
    # state-space (Mamba-2) layers of hybrid models: 8 heads x 16 = 128 channels (= expand 2 x hidden 64)
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_ssm": 128, "mamba_d_state": 16, "mamba_chunk_size": 16,
    # byte-latent models' hash embeddings, and the global transformer's width their local models project to
    "encoder_hash_byte_group_vocab": 256, "hidden_size_global": 64,
    # widths named per family: a depth decoder's backbone (CSM), Gemma 3n / 4's per-layer embeddings,
    # shared experts under other names, dense layers before the MoE ones (LFM2-MoE)
    "backbone_hidden_size": 64, "vocab_size_per_layer_input": 256, "hidden_size_per_layer_input": 16,
    "shared_intermediate_size": 32, "shared_experts_intermediate_size": 32, "num_dense_layers": 1,
    "zero_expert_num": 2,  # LongCat-Flash's identity experts, routed next to the real ones (256 of them)
    # Phi-4-multimodal's audio conformer (24 blocks, 1024 channels; its output channels match its width)
    "num_blocks": 2, "nemo_conv_channels": 64, "ext_pw_out_channel": 64, "depthwise_separable_out_channel": 64,
}
# routed experts per token: never above the family's default (ZAYA validates top-1 routing)
TOPK_FIELDS = ("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token", "moe_k")
MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim")  # multi-head latent attention: head_dim from its parts
TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # EOS never ends the 8 tokens (min_new_tokens)
N_LAYERS = 2


def _layer_indices(config_dict: dict, n: int | None = None) -> list[int]:
    """The original layers the 2-layer model keeps: the first layer and the first one that differs
    from it in ``layer_types`` (else in another per-layer list such as ``no_rope_layers``), so a
    sliding + full, linear + full or RoPE + NoPE pattern survives; else layers 0 and 1. ``n``: the
    layer count (``num_hidden_layers`` of ``config_dict`` by default)."""
    n = (config_dict.get("num_hidden_layers") or 0) if n is None else n
    lists = [config_dict.get("layer_types")] + [v for k, v in config_dict.items() if k != "layer_types"]
    for values in lists:
        if isinstance(values, list) and len(values) == n and n > N_LAYERS:
            for i, v in enumerate(values):
                if v != values[0]:
                    return [0, i]
    return list(range(N_LAYERS))


def _per_layer(key: str, value, keep: list[int], n_layers: int):
    """A per-layer field cut to the kept layers: a list of one value per layer (or a string, under a
    key naming layers or a pattern), or (a key naming layers) a strictly increasing list of layer
    indices (``moe_layers``, ``attn_layer_indices``); None if ``value`` is neither."""
    if n_layers <= N_LAYERS or not isinstance(value, (list, str)) or not value:
        return None
    is_index_list = ("layer" in key and isinstance(value, list) and all(type(v) is int for v in value)
                     and value == sorted(set(value)) and value[-1] < n_layers
                     and (len(value) != n_layers or value == list(range(n_layers))))
    if is_index_list:
        return [j for j, i in enumerate(keep) if i in value]
    if len(value) == n_layers and (isinstance(value, list) or "layer" in key or "pattern" in key):
        picked = [value[i] for i in keep]
        return "".join(picked) if isinstance(value, str) else picked
    return None


def _size_keys(config, d: dict, sizes: dict) -> dict:
    """``sizes`` keyed by the field names ``config`` stores (its ``to_dict()`` keys ``d``): a size under
    an alias of the class's ``attribute_map`` (DBRX's ``d_model`` for ``hidden_size``, Bailing's
    ``num_expert_group`` for ``n_group``) lands on the field it names; "auto" strings stay derived, and
    a size that is 0 stays 0: it turns a part off (GraniteMoeShared's ``shared_intermediate_size: 0``,
    no shared expert), and shrinking never turns one on."""
    aliases = getattr(type(config), "attribute_map", None) or {}
    out = {}
    for k, v in sizes.items():
        key = k if k in d else aliases.get(k)
        if key in sizes and key != k:  # the field's own tiny size wins over an alias's (GLM-4-MoE-Lite's
            continue                   # head_dim -> qk_rope_head_dim)
        if key in d and not isinstance(d[key], str) and d[key] != 0:
            out[key] = v
    return out


def _mla_head_dim(d: dict, out: dict, sizes: dict) -> int | None:
    """The tiny ``head_dim`` of a multi-head latent attention config: what it was made of in the
    full config (the rotary part, as DeepSeek-V3 and LongCat-Flash store it, or rotary + non-rotary,
    Mistral 4), now of the tiny parts; a ``head_dim`` of its own (dots3's 256, the denominator of its
    partial rotary factor and the width its sliding-window overrides inherit) takes the tiny size;
    None (left to the config to derive) when the config has none."""
    hd, rope, nope = d.get("head_dim"), d.get("qk_rope_head_dim"), d.get("qk_nope_head_dim")
    if not isinstance(hd, int) or "qk_rope_head_dim" not in out:
        return None
    if hd == rope:
        return out["qk_rope_head_dim"]
    if isinstance(nope, int) and hd == rope + nope and "qk_nope_head_dim" in out:
        return out["qk_rope_head_dim"] + out["qk_nope_head_dim"]
    return sizes.get("head_dim")


def _shrunk_kwargs(config, sizes: dict) -> dict:
    """Constructor kwargs that shrink ``config`` (a default-built config object): ``sizes`` for the
    fields it has (:func:`_size_keys`; top-k routing never above its default, :data:`TOPK_FIELDS`),
    per-layer lists and ``per_layer_config`` cut to :func:`_layer_indices`, sub-configs shrunk the
    same way."""
    from transformers import PretrainedConfig

    d = config.to_dict()
    out = _size_keys(config, d, sizes)
    for k in TOPK_FIELDS:
        if k in out and isinstance(d[k], int):
            out[k] = min(out[k], d[k])
    if all(f in d for f in MLA_FIELDS):  # MLA: head_dim follows its parts, keys are per query head
        out.pop("head_dim", None)
        if (hd := _mla_head_dim(d, out, sizes)) is not None:
            out["head_dim"] = hd
        if "num_key_value_heads" in out:
            out["num_key_value_heads"] = out.get("num_attention_heads", sizes["num_attention_heads"])
    n_layers = _num_layers(config, d)
    keep = _layer_indices(d, n_layers)
    per_layer: list[str] = []
    for k, v in d.items():
        if k in out or k.startswith("_"):
            continue
        sub = getattr(config, k, None)
        if isinstance(sub, PretrainedConfig):
            out[k] = {**sub.to_dict(), **_shrunk_kwargs(sub, sizes)}
            continue
        if k == "per_layer_config":
            if isinstance(v, dict) and v:
                out[k] = _per_layer_config(v, d, sizes, keep if n_layers > N_LAYERS else list(range(n_layers)))
            continue
        cut = _per_layer(k, v, keep, n_layers)
        if cut is not None and len(cut) == len(keep) and len(v) == n_layers:
            per_layer.append(k)  # one value per layer (not a list of layer indices)
        if cut is None:
            cut = _hybrid_layout(k, v, n_layers)
        if cut is not None:
            out[k] = _with_attention(cut) if k == "layer_types" else cut
    shared = d.get("num_kv_shared_layers")
    if isinstance(shared, int) and shared > 0 and n_layers > N_LAYERS:
        out.update(_kv_shared_layers(out, per_layer))
    return out


def _kv_shared_layers(out: dict, per_layer: list[str]) -> dict:
    """The kept layers followed by one KV-sharing layer each (Gemma 3n: its last 15 of 35 layers
    reuse the cache of the last earlier layer of their type): the per-layer fields repeated, 4 layers
    of which the last 2 are shared, so both layer types still produce a cache before any reuses it
    (2 layers with 15 shared produce none) and the reused-cache path is checked."""
    n = len(next(iter(out[k] for k in per_layer), [0] * N_LAYERS))
    return {**{k: out[k] + out[k] for k in per_layer}, "num_hidden_layers": 2 * n, "num_kv_shared_layers": n}


def _num_layers(config, d: dict) -> int:
    """The config's layer count, under ``num_hidden_layers`` or its ``attribute_map`` alias (``n_layers``)."""
    aliases = getattr(type(config), "attribute_map", None) or {}
    n = d.get("num_hidden_layers", d.get(aliases.get("num_hidden_layers", ""), 0))
    return n if isinstance(n, int) else 0


def _per_layer_config(value: dict, d: dict, sizes: dict, keep: list[int]) -> dict:
    """A ``per_layer_config`` (layer index -> the fields that layer overrides, as Gemma 4's wider
    full-attention heads and dots3's sliding-window MLA shapes are stored) for the kept layers,
    renumbered, each override shrunk like the config itself: ``sizes`` on its fields, an MLA override
    with as many key heads as query heads, and a ``head_dim`` override at its ratio to the config's
    own ``head_dim`` (Gemma 4: 512 over 256 stays twice the tiny head_dim) so the layers still differ.
    Without this the overrides kept their full sizes (a 20M-parameter dots3 layer)."""
    by_index = {int(i): v for i, v in value.items()}  # to_dict() writes the indices as strings ("02")
    out = {}
    for j, i in enumerate(keep):
        override = by_index.get(i)
        if not isinstance(override, dict):
            continue
        small = {k: v for k, v in sizes.items() if k in override and not isinstance(override[k], str)}
        if all(f in {**d, **override} for f in MLA_FIELDS) and "num_key_value_heads" in small:
            small["num_key_value_heads"] = small.get("num_attention_heads", sizes["num_attention_heads"])
        hd, base = override.get("head_dim"), d.get("head_dim")
        if "head_dim" in small and isinstance(hd, int) and isinstance(base, int) and hd % base == 0:
            small["head_dim"] = sizes["head_dim"] * (hd // base)
        out[j] = {**override, **small}
    return out


def _with_attention(layer_types: list) -> list:
    """Cut ``layer_types`` with its last layer made ``full_attention`` when every kept layer is a
    ``linear_attention`` (state-space) one, as transformers' default GraniteMoeHybrid config is: a
    model without an attention layer has no RoPE to check (and its cache cannot report a length)."""
    if layer_types and all(t == "linear_attention" for t in layer_types):
        return [*layer_types[:-1], "full_attention"]
    return layer_types


def _hybrid_layout(key: str, value, n_layers: int):
    """A hybrid model's layout that 2 layers would lose its attention layer under: a cyclic block
    pattern shorter than the model (``block_types: [recurrent, recurrent, attention]``) becomes its
    distinct kinds in order (recurrent, attention); no attention layers named (``attn_layer_indices:
    None``, every layer a state-space one) becomes layer 1. None for any other field."""
    if key == "attn_layer_indices" and value is None and n_layers > N_LAYERS:
        return [N_LAYERS - 1]
    if (key.endswith("block_types") and isinstance(value, list) and 0 < len(value) < n_layers
            and all(isinstance(v, str) for v in value)):
        return list(dict.fromkeys(value))[:N_LAYERS]
    return None


def _dbrx(base, kwargs: dict) -> dict:
    # DbrxAttention reads attn_config.rope_theta, a field of DBRX's published config.json that
    # DbrxAttentionConfig does not declare (a default-built one lacks it): the model's own theta; and
    # it clamps q/k/v to +-clip_qkv, which fails at the default None: DBRX's published clip_qkv 8
    return {"attn_config": {**kwargs.get("attn_config", {}), "rope_theta": base.rope_parameters["rope_theta"],
                            "clip_qkv": 8}}


def _lfm2_moe(base, kwargs: dict) -> dict:
    # Lfm2MoeConfig leaves layer_types None, which its own decoder layers index: LFM2's short-conv
    # layers with attention layers between them, one of each
    return {"layer_types": ["conv", "full_attention"]}


def _cohere_compass(base, kwargs: dict) -> dict:
    # the default CohereCompassTextConfig has rope_parameters {} (per-layer-type, None for NoPE) and
    # its rotary embedding indexes it by layer type: Cohere's sliding-window RoPE layers with a global
    # NoPE layer (Command A's layout), so both layer kinds and the NoPE path are checked
    return {"layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 50_000.0},
                                "full_attention": None}}


def _qwen4_exp(base, kwargs: dict) -> dict:
    # its indexed_attention layers build a QSA indexer from fields the default config leaves None:
    # the one key head QSA requires, 4 query heads of the tiny head_dim, and a token budget (a
    # multiple of the block size) past the checked sequences, as the DSA families' index_topk is
    return {"indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": TINY_SIZES["head_dim"],
            "indexer_budget": 2048, "indexer_compress_ratio": 4}


def _granitemoehybrid(base, kwargs: dict) -> dict:
    # GraniteMoeHybrid's attention layers use RoPE only with position_embedding_type "rope" (default
    # None: NoPE), so the tiny model turns on the rotary path this check is about
    return {"position_embedding_type": "rope"}


def _rotary_dim(base, kwargs: dict) -> dict:
    # GPT-J and CodeGen rotate a fixed rotary_dim (64) of each head: above the tiny head (16), their own model
    # fails to run; a quarter of the head, as the published 64 of 256
    return {"rotary_dim": TINY_SIZES["head_dim"] // 4}


def _dory(base, kwargs: dict) -> dict:
    # Dory runs input, recurrent (n_recurrent_loops times) and output sections of its layers, 8 / 20 / 8 by
    # default, and stores each layer as an attention and an mlp block (to_dict doubles the counts, the config
    # halves them back): shrunk to 2 entries, 1 layer remained inside sections of 4 that ran it twice into
    # one cache (its attention then added a 12-key mask to 24 keys). A sliding input layer and a
    # full-attention recurrent one, as the published 3 sliding : 1 full pattern with its recurrent loop
    return {"layer_types": ["sliding_attention", "full_attention"], "num_hidden_layers": N_LAYERS,
            "n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 0}


# model_type -> (default config, shrunk kwargs) -> more kwargs: families whose default config cannot
# build or run its own model, or keeps its rotary embedding off, each with the reason above
FAMILY_OVERRIDES = {"dbrx": _dbrx, "lfm2_moe": _lfm2_moe, "cohere_compass_text": _cohere_compass,
                    "qwen4_exp_text": _qwen4_exp, "granitemoehybrid": _granitemoehybrid, "gptj": _rotary_dim,
                    "codegen": _rotary_dim, "dory": _dory}


def tiny_config(config_cls, **overrides):
    """A tiny config of ``config_cls`` (:data:`TINY_SIZES` on every field it has, layer lists cut to
    2 layers, eager attention, :data:`TOKENS`; :data:`FAMILY_OVERRIDES` for its model type), plus
    ``overrides``."""
    base = config_cls()
    kwargs = {**_shrunk_kwargs(base, TINY_SIZES), **{k: v for k, v in TOKENS.items() if k in base.to_dict()}}
    family = FAMILY_OVERRIDES.get(getattr(config_cls, "model_type", ""))
    if family is not None:
        kwargs.update(family(base, kwargs))
    kwargs.update(_even_rotary_head_dim(base, kwargs))
    config = config_cls(**{**kwargs, **overrides})
    config._attn_implementation = "eager"
    return config


def _even_rotary_head_dim(base, kwargs) -> dict:
    """``{"head_dim": d}`` when the tiny head_dim times a partial rotary factor of the config rounds down
    to an odd rotary dim (MiMo-V2-Flash: 0.334 x 16 = 5, where the published 0.334 x 192 = 64): the
    smallest multiple of 8 above it that gives every factor an even rotary dim; else nothing."""
    head_dim = kwargs.get("head_dim")
    if not isinstance(head_dim, int):
        return {}
    rp = kwargs.get("rope_parameters", getattr(base, "rope_parameters", None)) or {}
    groups = [v for v in rp.values() if isinstance(v, dict)] or [rp]
    factors = [float(f) for f in [getattr(base, "partial_rotary_factor", None)]
               + [g.get("partial_rotary_factor") for g in groups] if f]
    if all(int(head_dim * f) % 2 == 0 for f in factors):
        return {}
    d = next((d for d in range(head_dim + 8, 8 * head_dim + 1, 8)
              if all(int(d * f) % 2 == 0 and int(d * f) > 0 for f in factors)), head_dim)
    return {"head_dim": d}
