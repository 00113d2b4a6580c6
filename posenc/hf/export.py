"""Export a lab :class:`~posenc.models.tinylm.TinyLM` to a plain Hugging Face ``LlamaForCausalLM`` folder.

TinyLM's block is Llama's (pre-norm RMSNorm, attention without biases, SwiGLU MLP, tied embeddings), so a
model trained under a RoPE scheme *is* a Llama model; :func:`export` writes it as one:

* ``config.json`` (``LlamaConfig``): ``hidden_size = dim``, ``intermediate_size = LMConfig.mlp_hidden``,
  ``num_key_value_heads = n_kv_heads`` (GQA), ``head_dim = dim / n_heads``, ``rms_norm_eps`` of the model's
  norms, ``tie_word_embeddings=True``, ``hidden_act="silu"``, ``max_position_embeddings = train_len`` and
  ``rope_parameters = {"rope_type": "default", "rope_theta": rope.base}``, or the scheme's frequency
  scaling when transformers has the same ``rope_type`` (the registry's ``hf_native`` records: linear = PI,
  YaRN, Llama 3, transformers' dynamic NTK and LongRoPE, the last two only with ``rope.dynamic="sequence"``,
  transformers' rule of one schedule for the whole call; note that transformers' dynamic NTK module then
  keeps the longest schedule it has seen for later shorter calls above the trained length).
* ``model.safetensors``: the weights under Llama's names. The softmax scale is ``head_dim ** -0.5`` in
  both. posenc's ``"half"`` layout is Llama's ``rotate_half`` (pair ``(i, i + D/2)``); a model trained with
  the ``"interleaved"`` layout (pair ``(2i, 2i+1)``) gets the rows of every head of ``q_proj`` and ``k_proj``
  permuted to ``[0, 2, 4, ..., 1, 3, 5, ...]``, which turns interleaved pairs into halves without changing
  any ``q . k`` (the same permutation on both sides), so the logits are the same.
* the tokenizer: the lab's byte tokenizer becomes a ``tokenizers`` byte-level ``tokenizer.json`` (id b = byte
  b, id 256 = ``<|bos|>`` when the run used BOS; ``AutoTokenizer`` loads it; no BOS is added on encode,
  prepend ``bos_token_id`` yourself as the lab does between documents); a BPE run's ``tokenizers`` JSON is
  written as it is, with ``<|endoftext|>`` as BOS.

TinyLM's residual dropout has no Llama counterpart; it acts only in training (the exported config has
``attention_dropout=0``).

A layer pattern whose layers are plain RoPE layers (one RoPE spec, exportable as above) and layers without any
positional part (``PositionScheme.preset("nope_every4", ...)``, SmolLM3's NoPE layers) is written as a
``SmolLM3ForCausalLM`` (the same block, ``no_rope_layers[i] = 0`` for a NoPE layer). A pattern with chunked RoPE
layers and/or NoPE layers with Llama 4's temperature tuning (``PositionScheme.preset("irope", ...)``) is written
as a dense ``Llama4ForCausalLM`` (``moe_layers=[]``, ``use_qk_norm=False``, ``layer_types`` chunked for the RoPE
layers, ``attn_temperature_tuning``; q/k rows permuted to Llama 4's interleaved pairs for a half layout).
Other patterns are refused: sliding-window layers and RoPE layers with different bases (Gemma 3's local/global
pattern) have no counterpart in these blocks.

Every other scheme is refused with a ``ValueError`` naming it and the part Llama has no place for: added
position embeddings (sinusoidal, learned, FLOATER, ...), NoPE (transformers' Llama always rotates),
attention biases (ALiBi, T5, KERPLE, Sandwich), relative terms (Shaw, Transformer-XL, DeBERTa), memories
(Infini-attention), xPos, partial rotary, soft-capping, and inference-time methods (remaps, masks, log-n,
frequency schedules transformers lacks): export the trained model and apply those with
:func:`posenc.hf.extend`.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch

from posenc.methods import hf_methods
from posenc.models.tinylm import LMConfig, RMSNorm, TinyLM
from posenc.parts.masks import MaskSpec
from posenc.scheme.core import PositionScheme

__all__ = ["byte_tokenizer", "check_exportable", "export", "hf_tokenizer", "llama_config", "llama_state_dict",
           "to_llama"]

BOS_TOKEN = "<|bos|>"  # the byte tokenizer's id 256


# ===================================================================== what exports
def _native_records() -> dict:
    """transformers ``rope_type`` -> the registry record of the method transformers runs with it."""
    return {m.hf_rope_type: m for m in hf_methods().values() if m.hf_native}


def _refusal(scheme: PositionScheme) -> str | None:
    """Why ``scheme`` has no ``LlamaForCausalLM`` form, or None when it has one."""
    if scheme.layers is not None:
        return _pattern_refusal(scheme)
    emb = scheme.embedding
    if emb.kind != "nope":
        return (f"its {emb.kind!r} embedding adds position information to the token embeddings; "
                f"LlamaForCausalLM has no position embedding, only RoPE")
    if scheme.bias is not None:
        return f"{scheme.bias.kind!r} adds an attention bias that LlamaForCausalLM has no place for"
    if scheme.relative is not None:
        return (f"its {scheme.relative.kind!r} relative position terms enter the attention scores, "
                f"which LlamaForCausalLM computes from rotated q and k alone")
    if scheme.memory is not None:
        return f"its {scheme.memory.kind!r} memory has no counterpart in LlamaForCausalLM"
    if scheme.rope is None:
        return ("it has no positional encoding (NoPE), and LlamaForCausalLM always rotates q and k with "
                "RoPE; transformers has no NoPE mode for it")
    return _rope_refusal(scheme)


def _is_llama4(scheme: PositionScheme) -> bool:
    """True for a pattern that needs Llama 4's parts (chunked RoPE layers or NoPE temperature tuning)."""
    return scheme.layers is not None and any(s.mask.chunk is not None or s.temperature is not None
                                             for s in scheme.layers)


def _llama4_refusal(scheme: PositionScheme) -> str | None:
    """Why a pattern with chunked RoPE layers / NoPE temperature layers has no dense ``Llama4ForCausalLM`` form:
    RoPE layers of one spec and one mask (full or ``chunk``), NoPE layers that are plain or all carry the same
    Llama 4 temperature, and nothing else."""
    ropes = [s for s in scheme.layers if s.rope is not None]
    nopes = [s for s in scheme.layers if s.rope is None]
    if not ropes:
        return "it has no RoPE layer"
    for s in ropes:
        if s.temperature is not None:
            return f"its RoPE layer {s.name!r} has a query temperature; Llama 4 tunes only its NoPE layers"
        if s.mask != ropes[0].mask or replace(s.mask, chunk=None) != MaskSpec():
            masks = sorted({str(x.mask) for x in ropes})
            return f"its RoPE layers attend through masks other than one chunk size ({masks})"
        why = _rope_refusal(replace(s, mask=MaskSpec()))
        if why is not None:
            return f"its layer {s.name!r}: {why}"
        if s.rope != ropes[0].rope:
            return f"its RoPE layers differ ({sorted({str(x.rope) for x in ropes})}); Llama 4 has one rope_theta"
    temps = {None if s.temperature is None else json.dumps(s.temperature.to_dict(), sort_keys=True) for s in nopes}
    for s in nopes:
        if replace(s, temperature=None) != PositionScheme(name=s.name, train_len=s.train_len):
            return f"its NoPE layer {s.name!r} has other parts ({s.describe()}); Llama 4's NoPE layers attend fully"
    if len(temps) > 1 or (nopes and nopes[0].temperature is not None and nopes[0].temperature.kind != "llama4"):
        return "its NoPE layers differ in query temperature; Llama 4 has one attn_scale and floor_scale"
    floor = nopes[0].temperature.params.get("floor_scale") if nopes and nopes[0].temperature else None
    if floor is not None and not float(floor).is_integer():
        return f"its temperature floor_scale {floor} is not an integer, which Llama 4's floor_scale is"
    return None


def _pattern_refusal(scheme: PositionScheme) -> str | None:
    """Why a layer pattern has no ``SmolLM3ForCausalLM`` (RoPE layers of one spec + bare NoPE layers) or, with
    chunked / temperature layers, no dense ``Llama4ForCausalLM`` form."""
    if scheme.embedding.kind != "nope":
        return f"its {scheme.embedding.kind!r} embedding adds position information that SmolLM3 has no place for"
    if _is_llama4(scheme):
        return _llama4_refusal(scheme)
    ropes = [s for s in scheme.layers if s.rope is not None]
    for s in scheme.layers:
        if s.mask != MaskSpec():
            return (f"its layer {s.name!r} attends through a restricted mask ({s.mask}: chunked or sliding-window "
                    f"layers); the exported SmolLM3 block attends over every earlier token")
        if s.temperature is not None:
            return (f"its layer {s.name!r} scales queries by a position temperature ({s.temperature.kind}), which "
                    f"SmolLM3 does not")
        if s.rope is None and s != PositionScheme(name=s.name, train_len=s.train_len):
            return (f"its NoPE layer {s.name!r} has other parts ({s.describe()}); SmolLM3's NoPE layers are plain "
                    f"causal attention")
        why = _refusal(s) if s.rope is not None else None
        if why is not None:
            return f"its layer {s.name!r}: {why}"
    if not ropes:
        return "it has no RoPE layer; SmolLM3 rotates at least the layers not listed as NoPE"
    if any(s.rope != ropes[0].rope for s in ropes):
        return f"its RoPE layers differ ({sorted({str(s.rope) for s in ropes})}); SmolLM3 has one rope_theta"
    return None


def _rope_refusal(scheme: PositionScheme) -> str | None:
    rope = scheme.rope
    if rope.xpos:
        return "xPos scales q and k by a decay with position that LlamaForCausalLM's RoPE does not apply"
    if rope.partial_rotary_factor != 1.0:
        return (f"it rotates only a fraction {rope.partial_rotary_factor} of each head; LlamaForCausalLM "
                f"rotates the whole head")
    after = ("is an inference-time method, not part of the trained model; export the model under the "
             "scheme it trained with and apply the method with posenc.hf.extend(hf_model, ...)")
    if scheme.remap is not None:
        return f"its {scheme.remap.kind!r} position remap {after}"
    if scheme.mask != MaskSpec():
        return f"its attention mask ({scheme.mask}) {after}"
    if scheme.logn:
        return f"log-n query scaling {after}"
    if scheme.temperature is not None:
        return f"query temperature tuning ({scheme.temperature.kind}) has no LlamaForCausalLM counterpart"
    if scheme.softcap is not None:
        return "it soft-caps the attention logits, which LlamaForCausalLM does not"
    if scheme.multiaxis is not None:
        return (f"its multi-axis rotation ({scheme.multiaxis.kind}) reads [..., n_axes] positions; "
                f"LlamaForCausalLM rotates by one position per token")
    if scheme.gate is not None:
        return f"its forget gate ({scheme.gate.kind}) adds a data-dependent bias LlamaForCausalLM has no place for"
    if rope.scaling is None:
        return None
    from posenc.parts.frequencies import is_dynamic

    rope_type = rope.scaling.get("rope_type")
    if rope_type not in _native_records():
        return (f"its frequency schedule {rope_type!r} has no transformers rope_type (transformers has "
                f"{sorted(_native_records())}); it {after}")
    if is_dynamic(rope.scaling) and (rope.dynamic != "sequence" or rope.dynamic_step != 1):
        return (f"its {rope_type!r} schedule changes with the length for each query (rope.dynamic="
                f"{rope.dynamic!r}, dynamic_step={rope.dynamic_step}); transformers' {rope_type!r} uses one "
                f"schedule for the whole call (rope.dynamic='sequence'), so the logits would differ past "
                f"the trained length")
    return None


def check_exportable(scheme: PositionScheme) -> None:
    """``ValueError`` naming the scheme and what LlamaForCausalLM cannot express, unless it is RoPE
    (any base, either layout, a transformers-native frequency scaling)."""
    if not isinstance(scheme, PositionScheme):
        raise ValueError(f"scheme must be a PositionScheme, got {type(scheme).__name__}")
    why = _refusal(scheme)
    if why is not None:
        target = "LlamaForCausalLM" if scheme.layers is None else ("Llama4ForCausalLM" if _is_llama4(scheme)
                                                                     else "SmolLM3ForCausalLM")
        raise ValueError(f"scheme {scheme.name!r} does not export to {target}: {why}")


def _rope_layer(scheme: PositionScheme) -> PositionScheme:
    """The scheme whose RoPE an exported model uses: the scheme, or a pattern's (one) RoPE layer spec."""
    return scheme if scheme.layers is None else next(s for s in scheme.layers if s.rope is not None)


# ===================================================================== config and weights
def _rope_parameters(scheme: PositionScheme, train_len: int) -> tuple[dict, int]:
    """``(rope_parameters, max_position_embeddings)`` for transformers. Without scaling the length is the
    model's ``train_len`` (what :func:`posenc.hf.train_len_of` reads back); transformers' dynamic NTK reads
    the trained length from ``max_position_embeddings``; YaRN / Llama 3 / LongRoPE read
    ``original_max_position_embeddings`` and expect ``max_position_embeddings`` = factor x that (else
    transformers warns, or LongRoPE infers its factor from the ratio)."""
    rope = scheme.rope
    params = {"rope_type": "default", "rope_theta": float(rope.base)}
    if rope.scaling is None:
        return params, int(train_len)
    scaling = dict(rope.scaling)
    longest = scaling.pop("max_position_embeddings", None)
    trained = int(scaling.get("original_max_position_embeddings") or longest or train_len)
    record = _native_records()[scaling["rope_type"]]
    if record.hf_original_len:
        scaling["original_max_position_embeddings"] = trained
        factor = scaling.get("factor")
        if longest is None and factor is not None:
            longest = max(trained, round(float(factor) * trained))
        return {**params, **scaling}, int(longest or trained)
    scaling.pop("original_max_position_embeddings", None)
    return {**params, **scaling}, trained


def llama_config(cfg: LMConfig, *, rms_norm_eps: float = 1e-6, bos_token_id: int | None = None):
    """The ``transformers.LlamaConfig`` of a TinyLM with config ``cfg`` (``ValueError`` when its scheme does
    not export, :func:`check_exportable`)."""
    from transformers import LlamaConfig

    check_exportable(cfg.scheme)
    rope_parameters, max_len = _rope_parameters(_rope_layer(cfg.scheme), cfg.train_len)
    shared = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.mlp_hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads or cfg.n_heads, hidden_act="silu",
        max_position_embeddings=max_len, rms_norm_eps=float(rms_norm_eps), tie_word_embeddings=True,
        rope_parameters=rope_parameters, attention_bias=False, mlp_bias=False, attention_dropout=0.0,
        bos_token_id=bos_token_id, eos_token_id=None, pad_token_id=None)
    if _is_llama4(cfg.scheme):
        return _llama4_config(cfg, shared)
    if cfg.scheme.layers is not None:  # a RoPE / NoPE pattern: SmolLM3 (no_rope_layers[i] = 0 for NoPE)
        from transformers import SmolLM3Config

        return SmolLM3Config(**shared, no_rope_layers=[int(s.rope is not None) for s in cfg.layer_schemes],
                             use_sliding_window=False)
    return LlamaConfig(**shared, head_dim=cfg.dim // cfg.n_heads)


def _llama4_config(cfg: LMConfig, shared: dict):
    """A dense ``Llama4TextConfig`` (no MoE layers, no q/k L2 norm): ``no_rope_layers``, ``layer_types``
    (chunked for the RoPE layers when they are chunked), the NoPE layers' temperature tuning."""
    from transformers import Llama4TextConfig

    layers = cfg.layer_schemes
    chunk = next(s.mask.chunk for s in layers if s.rope is not None)
    temp = next((s.temperature for s in layers if s.temperature is not None), None)
    tuning = {"attn_temperature_tuning": temp is not None}
    if temp is not None:
        tuning.update(attn_scale=float(temp.params.get("attn_scale", 0.1)),
                      floor_scale=int(temp.params.get("floor_scale", 8192)))
    return Llama4TextConfig(
        **shared, head_dim=cfg.dim // cfg.n_heads, intermediate_size_mlp=cfg.mlp_hidden, moe_layers=[],
        use_qk_norm=False, no_rope_layers=[int(s.rope is not None) for s in layers], attention_chunk_size=chunk,
        layer_types=["chunked_attention" if s.rope is not None and chunk else "full_attention" for s in layers],
        **tuning)


_NAMES = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm", "attn": "self_attn"}


def _half_layout(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of ``w [heads * head_dim, dim]`` reordered per head from interleaved pairs to halves."""
    perm = torch.cat([torch.arange(0, head_dim, 2, device=w.device), torch.arange(1, head_dim, 2, device=w.device)])
    return w.view(-1, head_dim, w.shape[-1])[:, perm].reshape(w.shape)


def _interleaved_layout(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows of ``w [heads * head_dim, dim]`` reordered per head from halves to interleaved pairs (the inverse
    of :func:`_half_layout`; Llama 4 rotates interleaved pairs)."""
    perm = torch.stack([torch.arange(head_dim // 2, device=w.device),
                        torch.arange(head_dim // 2, head_dim, device=w.device)], 1).flatten()
    return w.view(-1, head_dim, w.shape[-1])[:, perm].reshape(w.shape)


def llama_state_dict(model: TinyLM) -> dict[str, torch.Tensor]:
    """The TinyLM's weights under ``LlamaForCausalLM`` names (``model.embed_tokens``, ``model.layers.<i>.
    {input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}``,
    ``model.norm``; ``lm_head`` is tied), q/k rows permuted for an interleaved layout."""
    check_exportable(model.scheme)
    llama4 = _is_llama4(model.scheme)  # Llama 4: interleaved pairs, the MLP named feed_forward
    relayout = _half_layout if _rope_layer(model.scheme).rope.layout == "interleaved" else _interleaved_layout
    if (_rope_layer(model.scheme).rope.layout == "interleaved") == llama4:
        relayout = None
    names = {**_NAMES, "mlp": "feed_forward"} if llama4 else _NAMES
    head_dim = model.cfg.dim // model.cfg.n_heads
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        value = value.detach()
        parts = key.split(".")
        if key == "tok.weight":
            out["model.embed_tokens.weight"] = value
        elif key == "norm.weight":
            out["model.norm.weight"] = value
        elif parts[0] == "blocks" and len(parts) >= 4:
            if relayout is not None and parts[2] == "attn" and parts[3] in ("q_proj", "k_proj"):
                value = relayout(value, head_dim)
            name = ".".join(names.get(p, p) for p in parts[2:])
            out[f"model.layers.{parts[1]}.{name}"] = value
        else:
            raise ValueError(f"TinyLM weight {key!r} has no LlamaForCausalLM counterpart")
    return out


def to_llama(model: TinyLM):
    """A ``transformers.LlamaForCausalLM`` (eval mode, the TinyLM's dtype) with the TinyLM's weights;
    ``SmolLM3ForCausalLM`` for a RoPE / NoPE layer pattern (see the module docstring)."""
    from transformers import Llama4ForCausalLM, LlamaForCausalLM, SmolLM3ForCausalLM

    if not isinstance(model, TinyLM):
        raise ValueError(f"export needs a posenc TinyLM or a run folder, got {type(model).__name__}")
    norms = {m.eps for m in model.modules() if isinstance(m, RMSNorm)}
    if len(norms) != 1:
        raise ValueError(f"LlamaForCausalLM has one rms_norm_eps; this TinyLM's norms use {sorted(norms)}")
    weights = llama_state_dict(model)  # refuses a scheme that does not export, before anything is built
    dtype = next(model.parameters()).dtype
    config = llama_config(model.cfg, rms_norm_eps=norms.pop())
    cls = LlamaForCausalLM if model.scheme.layers is None else (
        Llama4ForCausalLM if _is_llama4(model.scheme) else SmolLM3ForCausalLM)
    llama = cls(config).to(dtype)
    missing, unexpected = llama.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"weights do not fit LlamaForCausalLM: missing {missing[:4]}, unexpected {unexpected[:4]}")
    if llama.lm_head.weight.data_ptr() != llama.model.embed_tokens.weight.data_ptr():
        raise ValueError("LlamaForCausalLM did not tie lm_head to embed_tokens (tie_word_embeddings)")
    return llama.eval()


# ===================================================================== tokenizer
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character of each byte, the alphabet of ``tokenizers``' ByteLevel."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def byte_tokenizer(bos: bool = True):
    """The lab's :class:`~posenc.data.tokenizer.ByteTokenizer` as a ``transformers`` fast tokenizer: id b is
    byte b (a byte-level BPE without merges), id 256 is ``<|bos|>`` when ``bos``; encoding adds nothing,
    decoding is UTF-8 (invalid bytes replaced)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: b for b, c in _byte_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    if not bos:
        return PreTrainedTokenizerFast(tokenizer_object=tok)
    tok.add_special_tokens([AddedToken(BOS_TOKEN, special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS_TOKEN)


def hf_tokenizer(tokenizer):
    """A ``transformers`` tokenizer for a lab tokenizer (byte or BPE), a tokenizer name (``"byte"``), or a
    ``transformers`` tokenizer (returned as it is)."""
    from posenc.data.tokenizer import BPETokenizer, ByteTokenizer, make_tokenizer

    if isinstance(tokenizer, str):
        tokenizer = make_tokenizer(tokenizer)
    if isinstance(tokenizer, ByteTokenizer):
        return byte_tokenizer(bos=tokenizer.bos_id is not None)
    if isinstance(tokenizer, BPETokenizer):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend, bos_token=tokenizer.SPECIAL)
    if hasattr(tokenizer, "save_pretrained"):
        return tokenizer
    raise ValueError(f"tokenizer must be a lab tokenizer, a tokenizer name or a transformers tokenizer, got "
                     f"{type(tokenizer).__name__}")


# ===================================================================== export
def export(model_or_run_dir, out_dir, *, tokenizer=None) -> Path:
    """Write ``model_or_run_dir`` (a :class:`TinyLM`, or a run folder of ``posenc train``) to ``out_dir`` as a
    ``LlamaForCausalLM`` folder that plain ``transformers.AutoModelForCausalLM.from_pretrained`` loads
    with the same logits (see the module docstring for the mapping and what is refused). ``tokenizer``:
    written next to it (:func:`hf_tokenizer`); None takes a run folder's own tokenizer and writes none for a
    model. Returns ``out_dir``. The folder is written as a whole (:func:`posenc.runtime.folders.staged_folder`):
    ``out_dir`` must be absent or empty, and a failure leaves it as it was."""
    from posenc.runtime.folders import staged_folder

    out = Path(out_dir)
    if out.exists() and not out.is_dir():  # save_pretrained would log an error and write nothing
        raise ValueError(f"export: out_dir {str(out)!r} exists and is not a folder; give a folder to write the "
                         f"Llama model into")
    if isinstance(model_or_run_dir, (str, os.PathLike)):
        from posenc.models.checkpoint import load_run

        model, run_tokenizer = load_run(model_or_run_dir)
        tokenizer = run_tokenizer if tokenizer is None else tokenizer
    else:
        model = model_or_run_dir
    llama = to_llama(model)
    hf_tok = None if tokenizer is None else hf_tokenizer(tokenizer)
    if hf_tok is not None:
        if len(hf_tok) > model.cfg.vocab_size:
            raise ValueError(f"the tokenizer has {len(hf_tok)} tokens but the model only {model.cfg.vocab_size}")
        bos = hf_tok.bos_token_id
        llama.config.bos_token_id = llama.generation_config.bos_token_id = bos
    with staged_folder(out, what="export's out_dir") as stage:
        llama.save_pretrained(stage)
        if not (stage / "config.json").is_file():
            raise ValueError(f"export: transformers wrote no config.json into {str(out)!r}")
        if hf_tok is not None:
            hf_tok.save_pretrained(stage)
    return out
