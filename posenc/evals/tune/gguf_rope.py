"""A tuned RoPE schedule in llama.cpp's GGUF form (``rope.gguf`` beside the tune's native winner): the keys and
tensors :mod:`posenc.hf.gguf_export` maps a transformers ``config.json`` to, checked against posenc's own schedule,
written with the ``gguf`` package's ``GGUFWriter`` and read back with its ``GGUFReader``.

llama.cpp reads ``{arch}.context_length``, ``{arch}.rope.freq_base``, ``{arch}.rope.dimension_count``,
``{arch}.rope.scaling.type`` (``none``, ``linear``, ``yarn``, ``longrope``), ``.factor``,
``.original_context_length`` and ``.attn_factor``; LongRoPE's per-pair divisors are the float32 tensors
``rope_factors_long.weight`` and ``rope_factors_short.weight`` (``[head_dim/2]``) under the scaling type ``longrope``
(without a ``.factor`` key: llama.cpp would divide every frequency by it once more), Llama 3's the tensor
``rope_freqs.weight``. A whole model with these keys (the same quantised tensors as the source GGUF) is
``posenc extend MODEL --format gguf``.
"""

from __future__ import annotations

from pathlib import Path

from posenc.hf.gguf_export import llama_cpp_rope, read_gguf_rope, write_rope_keys

__all__ = ["SCALED_TYPES", "read_rope_gguf", "write_rope_gguf"]

SCALED_TYPES = ("linear", "yarn", "longrope", "llama3")  # the rope types with a scaling schedule llama.cpp reads


def write_rope_gguf(path, config: dict, arch: str = "llama") -> Path:
    """Write the RoPE schedule of ``config`` (a transformers ``config.json`` dict with flat ``rope_parameters``) as
    llama.cpp's GGUF keys and tensors (module docstring). Returns ``path``. ``ValueError``
    (:class:`posenc.hf.gguf_export.NotServable`) with the reason for a schedule llama.cpp cannot serve as posenc
    runs it. The file is written whole or not at all (a temp file ``.NAME.*.tmp`` beside it, moved over it at the
    end): a failure (a full disk) leaves the previous file as it was and no temp file, and the ``OSError`` names
    ``path``."""
    return write_rope_keys(path, llama_cpp_rope(config), arch)


def read_rope_gguf(path) -> dict:
    """The RoPE keys and factor tensors of a GGUF file (:func:`posenc.hf.gguf_export.read_gguf_rope`)."""
    return read_gguf_rope(path)
