"""A tuned RoPE schedule in llama.cpp's GGUF form, written with the ``gguf`` package's ``GGUFWriter`` and read back
with its ``GGUFReader``.

llama.cpp reads RoPE scaling from these metadata keys (``{arch}`` the architecture, ``llama`` for Llama models):
``{arch}.context_length``, ``{arch}.rope.freq_base``, ``{arch}.rope.dimension_count``, ``{arch}.rope.scaling.type``
(``none``, ``linear``, ``yarn``), ``{arch}.rope.scaling.factor``, ``{arch}.rope.scaling.original_context_length``,
``{arch}.rope.scaling.attn_factor``; LongRoPE's per-dimension factors are the float32 tensors
``rope_factors_long.weight`` and ``rope_factors_short.weight`` (``[head_dim/2]``), as llama.cpp's converter writes
them for Phi-3 (``convert_hf_to_gguf.py``: ``MODEL_TENSOR.ROPE_FACTORS_LONG``/``_SHORT``). llama.cpp divides
each pair's frequency by its factor, which is transformers' ``longrope`` (``inv_freq / ext_factors``).

:func:`write_rope_gguf` writes those keys and tensors for a transformers ``config.json`` dict (a GGUF holding the
RoPE part of the model; :func:`read_rope_gguf` reads them back into the same ``rope_parameters`` form).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from posenc.runtime.atomic import fsync_dir, named_os_error

__all__ = ["SCALED_TYPES", "read_rope_gguf", "write_rope_gguf"]

_TYPES = {"default": "none", "linear": "linear", "yarn": "yarn", "longrope": "none"}
SCALED_TYPES = ("linear", "yarn", "longrope")  # the rope types with a scaling schedule llama.cpp reads


def _rope(config: dict) -> dict:
    rp = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rp.setdefault("rope_type", rp.get("type", "default"))
    if "rope_theta" not in rp and "rope_theta" in config:
        rp["rope_theta"] = config["rope_theta"]
    return rp


def write_rope_gguf(path, config: dict, arch: str = "llama") -> Path:
    """Write the RoPE schedule of ``config`` (a transformers ``config.json`` dict with flat ``rope_parameters``
    of type ``default``, ``linear``, ``yarn`` or ``longrope``) as llama.cpp's GGUF keys and tensors (module
    docstring). Returns ``path``. ``ValueError`` for a rope type llama.cpp has no form for. The file is written
    whole or not at all (a temp file ``.NAME.*.tmp`` beside it, moved over it at the end): a failure (a full disk)
    leaves the previous file as it was and no temp file, and the ``OSError`` names ``path``."""
    import gguf

    rp = _rope(config)
    kind = rp["rope_type"]
    if kind not in _TYPES:
        raise ValueError(f"rope_type must be one of {sorted(_TYPES)} for a GGUF, got {kind!r}")
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    orig = int(rp.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
               or config["max_position_embeddings"])
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # remove_stale_temps' form
        os.close(fd)
    except OSError as exc:
        raise named_os_error(exc, path) from None
    try:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_context_length(int(config["max_position_embeddings"]))
        w.add_rope_freq_base(float(rp.get("rope_theta", 10000.0)))
        w.add_rope_dimension_count(head_dim)
        w.add_rope_scaling_type(gguf.RopeScalingType(_TYPES[kind]))
        if kind != "default":
            w.add_rope_scaling_factor(float(rp.get("factor", 1.0)))
            w.add_rope_scaling_orig_ctx_len(orig)
        if "long_factor" in rp:  # LongRoPE's per-dimension factors
            factor = float(rp.get("factor") or config["max_position_embeddings"] / orig)
            attn = rp.get("attention_factor")
            if attn is None:
                attn = math.sqrt(1 + math.log(factor) / math.log(orig)) if factor > 1 else 1.0
            w.add_rope_scaling_attn_factors(float(attn))
            for name in ("long", "short"):
                lam = np.asarray(rp[f"{name}_factor"], dtype=np.float32)
                if lam.shape != (head_dim // 2,):
                    raise ValueError(f"{name}_factor must have head_dim/2 = {head_dim // 2} entries, got {lam.shape}")
                w.add_tensor(f"rope_factors_{name}.weight", lam)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
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
    return path


def read_rope_gguf(path) -> dict:
    """The RoPE keys and factor tensors of a GGUF file: ``{"arch", "context_length", "rope_theta", "head_dim",
    "scaling_type", "factor", "original_context_length", "attention_factor", "long_factor", "short_factor"}``
    (absent ones as None)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = _value(r, "general.architecture")

    def key(name):
        return _value(r, f"{arch}.{name}")

    tensors = {t.name: np.asarray(t.data, dtype=np.float64).tolist() for t in r.tensors}
    return {"arch": arch, "context_length": key("context_length"), "rope_theta": key("rope.freq_base"),
            "head_dim": key("rope.dimension_count"), "scaling_type": key("rope.scaling.type"),
            "factor": key("rope.scaling.factor"),
            "original_context_length": key("rope.scaling.original_context_length"),
            "attention_factor": key("rope.scaling.attn_factor"), "long_factor": tensors.get("rope_factors_long.weight"),
            "short_factor": tensors.get("rope_factors_short.weight")}


def _value(reader, name: str):
    field = reader.fields.get(name)
    if field is None:
        return None
    part = field.parts[field.data[0]]
    if field.types and field.types[0] == __import__("gguf").GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    return part.tolist()[0]
