"""A transformers-native RoPE schedule in llama.cpp's GGUF form: the keys and tensors llama.cpp reads, a copy of a
source GGUF with them (the same quantised tensors, byte for byte), the equivalent ``llama-cli``/``llama-server``
flags, and a refusal, with its reason, for any schedule llama.cpp would serve differently.

What llama.cpp reads (``src/llama-arch.cpp``, ``src/llama-model.cpp``, ``src/llama-context.cpp``,
``ggml/src/ggml-cpu/ops.cpp`` of the llama.cpp that llama-cpp-python 0.3.36 vendors), for the ``llama``
architecture:

- ``{arch}.rope.scaling.type`` (``none``, ``linear``, ``yarn``, ``longrope``), ``.factor`` (the frequency scale is
  ``1 / factor``; ``none`` forces it to 1), ``.original_context_length`` (YaRN's ramp and LongRoPE's long/short
  switch), ``.attn_factor`` (multiplies the cos/sin magnitude), ``{arch}.rope.freq_base``, ``{arch}.context_length``
  (the default context);
- the per-pair divisors of each frequency as float32 tensors ``[n_rot/2]``: ``rope_freqs.weight`` (Llama 3's
  scaling, baked in by ``convert_hf_to_gguf.py``) for every type but ``longrope``, ``rope_factors_long.weight`` and
  ``rope_factors_short.weight`` for ``longrope`` (long when the *context size* exceeds the original length,
  whatever the prompt's length: transformers switches per forward on the sequence length);
- YaRN's magnitude: llama.cpp sets ``yarn_attn_factor = mscale(s) / (1 + 0.1 ln s) * attn_factor`` and the rope
  kernel multiplies by ``1 + 0.1 ln s`` again, so the served magnitude is ``attn_factor * (1 + 0.1 ln s)``; any
  ``--yarn-attn-factor`` flag is overwritten for YaRN. ``beta_fast``/``beta_slow`` come only from flags (32 and 1
  by default; the ``yarn_beta_*`` keys are written by llama.cpp's saver but never read for Llama), and the ramp's
  ends are always floored/ceiled (transformers' ``truncate=True``).

:func:`llama_cpp_rope` maps a transformers ``config.json`` dict to those keys without reading the method's name: it
tries llama.cpp's own forms (no scaling, linear, YaRN, LongRoPE; last the per-pair ``rope_freqs`` divisors with an
``attn_factor``, which state any fixed schedule: Llama 3's, YaRN with other betas or ``truncate=False``) and keeps the
first whose frequencies and magnitude, recomputed with llama.cpp's formulas (:func:`served_frequencies`), equal
posenc's (:func:`posenc.parts.frequencies.rope_frequencies`, the schedule posenc's transformers path runs) to float32
rounding at the original length, the written context and 4 times it. Refused, naming the reason
(:class:`NotServable`): a schedule that changes with the length (dynamic NTK, dynamic YaRN: llama.cpp fixes the
frequencies when the context is made), per-layer-type schedules (one schedule per model), a model posenc extended
with its own engine (SelfExtend, ReRoPE, ...: no rope key expresses a remap; SelfExtend runs on llama.cpp through
group attention, :mod:`posenc.hf.llamacpp`), and any architecture but ``llama``.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posenc.runtime.atomic import fsync_dir, named_os_error

__all__ = ["LlamaCppRope", "NotServable", "check_servable_method", "llama_cpp_flags", "llama_cpp_rope",
           "read_gguf_rope", "serve_extended", "served_frequencies", "write_rope_keys", "write_served_gguf"]

_ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
_YARN_BETAS = (32.0, 1.0)  # llama.cpp's defaults (llama-hparams.h); only flags change them


class NotServable(ValueError):
    """A RoPE schedule llama.cpp cannot serve as posenc runs it; the message says why."""


@dataclass(frozen=True)
class LlamaCppRope:
    """What llama.cpp reads for one RoPE schedule (module docstring). ``factor`` None: no ``.factor`` key;
    ``ext_factor``: YaRN's ramp (1 for the ``yarn`` type, which llama.cpp derives from the type, 0 otherwise);
    ``freqs``/``long``/``short``: the per-pair divisor tensors, or None."""

    scaling_type: str
    freq_base: float
    n_rot: int
    context_length: int
    original_context_length: int
    factor: float | None = None
    ext_factor: float = 0.0
    attn_factor: float | None = None
    freqs: tuple[float, ...] | None = None
    long: tuple[float, ...] | None = None
    short: tuple[float, ...] | None = None


def _rope_parameters(config: dict) -> dict:
    rp = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rp and all(isinstance(v, dict) for v in rp.values()):
        raise NotServable("rope_parameters per layer type (sliding and full attention layers with their own "
                          "schedules): llama.cpp serves one RoPE schedule per model")
    rp = dict(rp)
    rp.setdefault("rope_type", rp.pop("type", "default"))
    if "rope_theta" not in rp:
        rp["rope_theta"] = config.get("rope_theta", 10000.0)
    return rp


def _posenc_schedule(config: dict, rp: dict, n_rot: int, length: int):
    """posenc's frequencies and magnitude for ``rp`` at ``length`` (the schedule its transformers path runs)."""
    from posenc.parts.frequencies import rope_frequencies

    lengths = {"max_position_embeddings": int(config["max_position_embeddings"])}
    if "original_max_position_embeddings" not in rp and config.get("original_max_position_embeddings"):
        lengths["original_max_position_embeddings"] = int(config["original_max_position_embeddings"])
    out = rope_frequencies(n_rot, float(rp["rope_theta"]), {**lengths, **rp}, seq_len=length)
    return out.inv_freq.double().numpy(), float(out.attention_scale)


def _forms(rp: dict, common: dict, plain: np.ndarray, inv: np.ndarray, magnitude: float):
    """llama.cpp's ways to write a schedule, its own first: no scaling, linear, YaRN (``factor``), LongRoPE (both
    factor lists), and last the per-pair divisors ``rope_freqs`` with ``attn_factor``, which states any schedule
    that does not change with the length (Llama 3's as ``convert_hf_to_gguf.py`` bakes it, YaRN with other betas)."""
    attn = None if magnitude == 1.0 else magnitude
    yield LlamaCppRope(**common, scaling_type="none", attn_factor=attn)
    s = rp.get("factor")
    if s:
        s = float(s)
        yield LlamaCppRope(**common, scaling_type="linear", factor=s, attn_factor=attn)
        if s > 1:  # llama.cpp multiplies the key by 1 + 0.1 ln s itself
            yield LlamaCppRope(**common, scaling_type="yarn", factor=s, ext_factor=1.0,
                               attn_factor=magnitude / (1 + 0.1 * math.log(s)))
    if rp.get("long_factor") is not None and rp.get("short_factor") is not None:
        yield LlamaCppRope(**common, scaling_type="longrope", attn_factor=magnitude,
                           long=tuple(float(x) for x in rp["long_factor"]),
                           short=tuple(float(x) for x in rp["short_factor"]))
    yield LlamaCppRope(**common, scaling_type="none", attn_factor=attn, freqs=tuple((plain / inv).tolist()))


def llama_cpp_rope(config: dict, n_rot: int | None = None) -> LlamaCppRope:
    """The llama.cpp keys and tensors for the RoPE schedule of ``config`` (a transformers ``config.json`` dict):
    the first of llama.cpp's forms (:func:`_forms`) whose frequencies and magnitude, recomputed with llama.cpp's
    formulas (:func:`served_frequencies`), equal posenc's schedule to float32 rounding at the model's original
    length, at its length (``max_position_embeddings``, also the context written) and at 4 times that. ``n_rot``:
    the rotary dimension (default the head dimension). :class:`NotServable`, with the reason, when none does."""
    rp = _rope_parameters(config)
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    n_rot = int(n_rot or head_dim)
    mpe = int(config["max_position_embeddings"])
    orig = int(rp.get("original_max_position_embeddings") or config.get("original_max_position_embeddings") or mpe)
    base = float(rp["rope_theta"])
    common = {"freq_base": base, "n_rot": n_rot, "context_length": mpe, "original_context_length": orig}
    lengths = (orig, mpe, 4 * mpe)  # 4 x: a context set past the written one (-c) still gets posenc's schedule
    want = {n: _posenc_schedule(config, rp, n_rot, n) for n in lengths}
    inv, magnitude = want[mpe]
    plain = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    for rope in _forms(rp, common, plain, inv, magnitude):
        if all(_same(served_frequencies(rope, n), want[n]) for n in lengths):
            return rope
    if not (_same(want[orig], want[mpe]) and _same(want[mpe], want[4 * mpe])):
        raise NotServable(f"rope_type {rp['rope_type']!r} changes the frequencies with the length (at "
                          f"{', '.join(map(str, lengths))} tokens): llama.cpp fixes them when the context is made "
                          f"(a dynamic schedule)")
    raise NotServable(f"no llama.cpp form gives rope_type {rp['rope_type']!r}'s frequencies and magnitude")


def _same(a, b) -> bool:
    (f, m), (g, n) = a, b
    return f.shape == g.shape and bool(np.allclose(f, g, rtol=1e-5, atol=0)) and math.isclose(m, n, rel_tol=1e-5)


def served_frequencies(rope: LlamaCppRope, n_ctx: int | None = None) -> tuple[np.ndarray, float]:
    """The inverse frequencies (``[n_rot/2]``, float64) and the cos/sin magnitude llama.cpp serves ``rope`` with
    in a context of ``n_ctx`` tokens (default its ``context_length``): llama-context.cpp's parameters and ggml's
    ``rope_yarn``/``ggml_rope_yarn_corr_dims``, in float64."""
    n_ctx = rope.context_length if n_ctx is None else n_ctx
    n = rope.n_rot
    theta = rope.freq_base ** (-np.arange(0, n, 2, dtype=np.float64) / n)
    if rope.long is not None:  # llama_model::get_rope_factors: by the context size
        ff = np.asarray(rope.long if n_ctx > rope.original_context_length else rope.short, dtype=np.float64)
    else:
        ff = np.asarray(rope.freqs, dtype=np.float64) if rope.freqs is not None else np.ones_like(theta)
    extrap = theta / ff
    scale = 1.0 if not rope.factor else 1.0 / rope.factor
    attn = 1.0 if rope.attn_factor is None else rope.attn_factor
    if not rope.ext_factor:  # theta = freq_scale * theta_extrap, magnitude attn_factor
        return extrap * scale, attn
    s = 1.0 / scale

    def corr_dim(rotations: float) -> float:
        return n * math.log(rope.original_context_length / (rotations * 2 * math.pi)) / (2 * math.log(rope.freq_base))

    low = max(0.0, math.floor(corr_dim(_YARN_BETAS[0])))
    high = min(n - 1.0, math.ceil(corr_dim(_YARN_BETAS[1])))
    y = (np.arange(n // 2, dtype=np.float64) - low) / max(0.001, high - low)
    mix = (1.0 - np.clip(y, 0.0, 1.0)) * rope.ext_factor  # rope_yarn_ramp
    mscale = (1 + 0.1 * math.log(s)) if s > 1 else 1.0  # get_mscale(s)
    kept = mscale / (1 + 0.1 * math.log(s)) * attn  # llama-context.cpp: cancelled, times rope.scaling.attn_factor
    return extrap * (scale * (1 - mix) + mix), kept * (1 + 0.1 * math.log(s))  # the kernel's own 1 + 0.1 ln s


def _kv(rope: LlamaCppRope, arch: str) -> dict:
    """``{key: (value, GGUFValueType)}`` of ``rope``; None values are keys to remove."""
    import gguf

    T = gguf.GGUFValueType
    keys = {f"{arch}.context_length": (rope.context_length, T.UINT32),
            f"{arch}.rope.freq_base": (rope.freq_base, T.FLOAT32),
            f"{arch}.rope.scaling.type": (rope.scaling_type, T.STRING),
            f"{arch}.rope.scaling.factor": (rope.factor, T.FLOAT32),
            f"{arch}.rope.scaling.original_context_length": (rope.original_context_length, T.UINT32),
            f"{arch}.rope.scaling.attn_factor": (rope.attn_factor, T.FLOAT32)}
    return {k: v for k, v in keys.items() if v[0] is not None}


def _tensors(rope: LlamaCppRope) -> dict:
    named = {"rope_freqs.weight": rope.freqs, "rope_factors_long.weight": rope.long,
             "rope_factors_short.weight": rope.short}
    return {k: np.asarray(v, dtype=np.float32) for k, v in named.items() if v is not None}


@contextlib.contextmanager
def _atomic_file(path: Path):
    """A temp file beside ``path`` (``.NAME.*.tmp``) moved over it when the block ends: ``path`` is written whole or
    not at all, and an ``OSError`` names ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as exc:
        raise named_os_error(exc, path) from None
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise named_os_error(exc, path) from None
        raise
    fsync_dir(path.parent)


def write_rope_keys(path, rope: LlamaCppRope, arch: str = "llama") -> Path:
    """A GGUF holding only ``rope``'s keys and tensors (the RoPE part of a model; ``posenc tune`` writes one beside
    its winner). Written whole or not at all."""
    import gguf

    path = Path(path)
    with _atomic_file(path) as tmp:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_rope_dimension_count(rope.n_rot)
        for key, (value, vtype) in _kv(rope, arch).items():
            w.add_key_value(key, value, vtype)
        for name, data in _tensors(rope).items():
            w.add_tensor(name, data)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path


def write_served_gguf(source, rope: LlamaCppRope, out, extra: dict | None = None) -> Path:
    """A copy of the GGUF ``source`` with ``rope``'s keys and tensors in place of its own RoPE keys and tensors
    (every other key and every other tensor copied as they are: the same quantised bytes), plus ``extra`` string
    keys (posenc's record of the method). Written whole or not at all."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = _string(reader, "general.architecture")
    if arch != "llama":
        raise NotServable(f"{source}: architecture {arch!r}; posenc writes llama.cpp's RoPE keys for 'llama' models "
                          f"(the only architecture whose RoPE tensors it checks)")
    n_rot = _scalar(reader, f"{arch}.rope.dimension_count")
    if n_rot is not None and int(n_rot) != rope.n_rot:
        raise NotServable(f"{source}: {arch}.rope.dimension_count is {n_rot}, the schedule has {rope.n_rot}")
    new = _kv(rope, arch)
    new.update({k: (v, gguf.GGUFValueType.STRING) for k, v in (extra or {}).items()})
    drop = {f"{arch}.rope.scaling.{k}" for k in ("type", "factor", "original_context_length", "attn_factor",
                                                 "finetuned", "yarn_log_multiplier", "yarn_ext_factor",
                                                 "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow")}
    out = Path(out)
    with _atomic_file(out) as tmp:
        w = gguf.GGUFWriter(tmp, arch, endianess=reader.endianess)
        for field in reader.fields.values():
            name = field.name
            if name == "general.architecture" or name.startswith("GGUF.") or name in new or name in drop:
                continue
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(name, field.contents(), vtype, sub_type=sub)
        for key, (value, vtype) in new.items():
            w.add_key_value(key, value, vtype)
        kept = [t for t in reader.tensors if t.name not in _ROPE_TENSORS]
        added = _tensors(rope)
        for t in kept:
            w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        for name, data in added.items():
            w.add_tensor_info(name, data.shape, data.dtype, data.nbytes, gguf.GGMLQuantizationType.F32)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in kept:
            w.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        for data in added.values():
            w.write_tensor_data(data)
        w.close()
    return out


def read_gguf_rope(path) -> dict:
    """The RoPE keys and tensors of a GGUF file: ``{"arch", "context_length", "rope_theta", "head_dim",
    "scaling_type", "factor", "original_context_length", "attention_factor", "rope_freqs", "long_factor",
    "short_factor"}`` (absent ones None)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = _string(r, "general.architecture")
    tensors = {t.name: np.asarray(t.data, dtype=np.float64).tolist() for t in r.tensors if t.name in _ROPE_TENSORS}
    kind = r.get_field(f"{arch}.rope.scaling.type")
    return {"arch": arch, "context_length": _scalar(r, f"{arch}.context_length"),
            "rope_theta": _scalar(r, f"{arch}.rope.freq_base"), "head_dim": _scalar(r, f"{arch}.rope.dimension_count"),
            "scaling_type": None if kind is None else kind.contents(),
            "factor": _scalar(r, f"{arch}.rope.scaling.factor"),
            "original_context_length": _scalar(r, f"{arch}.rope.scaling.original_context_length"),
            "attention_factor": _scalar(r, f"{arch}.rope.scaling.attn_factor"),
            "rope_freqs": tensors.get("rope_freqs.weight"), "long_factor": tensors.get("rope_factors_long.weight"),
            "short_factor": tensors.get("rope_factors_short.weight")}


def _string(reader, name: str) -> str | None:
    field = reader.get_field(name)
    return None if field is None else str(field.contents())


def _scalar(reader, name: str):
    field = reader.get_field(name)
    return None if field is None else field.contents()


def llama_cpp_flags(rope: LlamaCppRope) -> tuple[str | None, str]:
    """The ``llama-cli``/``llama-server`` flags that serve the *source* GGUF with ``rope``'s schedule, with the
    reason when no flags can (LongRoPE's and Llama 3's factors are tensors only a GGUF carries; llama.cpp overwrites
    ``--yarn-attn-factor`` for YaRN): ``(flags or None, why)``."""
    ctx = f"-c {rope.context_length}"
    if rope.freqs is not None or rope.long is not None:
        return None, "the per-pair factors are tensors that only the written GGUF carries; no flag sets them"
    plain_magnitude = rope.attn_factor is None or math.isclose(rope.attn_factor, 1.0, rel_tol=1e-6)
    if not plain_magnitude:
        return None, ("no flag sets this magnitude (llama.cpp overwrites --yarn-attn-factor for YaRN); only the "
                      "GGUF key rope.scaling.attn_factor does")
    if rope.factor is None:
        return ctx, "no scaling"
    flags = f"{ctx} --rope-scaling {rope.scaling_type} --rope-scale {rope.factor:g}"
    if rope.ext_factor:
        return f"{flags} --yarn-orig-ctx {rope.original_context_length}", "YaRN, magnitude 0.1 ln s + 1"
    return flags, "linear interpolation"


def _engine_only(spec: str) -> str:
    return (f"method {spec!r} runs on posenc's engine (a remap, mask, cache policy or composition that no RoPE key of "
            f"llama.cpp expresses); llama.cpp serves yarn, pi/linear, longrope and llama3 as GGUF keys, and SelfExtend "
            f"through its group attention (posenc.hf.llamacpp.selfextend_logits)")


def check_servable_method(spec: str) -> None:
    """:class:`NotServable` unless ``spec`` is one method that ``extend`` hands to transformers' own code (its record's
    ``hf_native``): checked before a model is loaded."""
    from posenc.methods import parse_methods

    methods = parse_methods(spec, hf=True)
    if len(methods) != 1 or not (methods[0].hf_native or methods[0].is_identity):
        raise NotServable(_engine_only(spec))


def serve_extended(model, source, out) -> dict:
    """Write the GGUF that llama.cpp serves ``model`` (a model :func:`posenc.hf.extend` extended with a method
    transformers runs) with: a copy of the GGUF ``source`` it was loaded from, with the new RoPE keys and tensors
    and posenc's record of the method (``posenc.method``, ``posenc.params`` as JSON), at ``out``. Returns what the
    command prints: the keys written, the ``llama-cli``/``llama-server``/llama-cpp-python lines that serve the file,
    and the flags that serve ``source`` the same way (or why none can). :class:`NotServable` for a model extended
    by posenc's engine, naming the method."""
    import json

    from posenc.hf.patch import applied_params

    record = getattr(model, "_posenc_extended", None) or {}
    method = record.get("method", "none")
    if record and record.get("native") is not True:
        raise NotServable(_engine_only(method))
    config = model.config.to_dict()
    rope = llama_cpp_rope(config)
    params = applied_params(model)
    out = write_served_gguf(source, rope, out, {"posenc.method": method,
                                                "posenc.params": json.dumps(params, sort_keys=True)})
    flags, why = llama_cpp_flags(rope)
    n = rope.context_length
    said = {"saved": str(out), "method": method, "params": params, "gguf": read_gguf_rope(out),
            "llama-cli": f"llama-cli -m {out} -c {n}", "llama-server": f"llama-server -m {out} -c {n}",
            "llama_cpp_python": f"llama_cpp.Llama(model_path={str(out)!r}, n_ctx={n})",
            "flags_on_the_source": None if flags is None else f"-m {source} {flags}", "why": why}
    if rope.long is not None:
        said["note"] = (f"llama.cpp uses the long factors whenever the context size (-c) exceeds "
                        f"{rope.original_context_length}, also for a shorter prompt; transformers switches per "
                        f"forward on the sequence length")
    return said
