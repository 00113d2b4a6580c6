"""What a Hugging Face model *is*, for the keys of cached results (suite cells, tune cells): its content, never the
name of the folder it sits in.

Two different models saved as ``a/model`` and ``b/model`` must not answer for each other in a shared cell store,
and one model copied elsewhere should find its cells again. :func:`model_id` is therefore ``hf-<digest>:<type>``
for a plain ``save_pretrained`` folder, the digest (:func:`content_digest`) taken over the folder's files:

- small files (``config.json``, the tokenizer files, a weights index, a small model's weights: up to
  :data:`WHOLE_FILE_BYTES`) wholly;
- a large weights file by its name, size, its safetensors header (every tensor's name, dtype, shape and offsets),
  the first :data:`TENSOR_BYTES` bytes of every tensor and :data:`SAMPLES` blocks spread over the file. A fine-tuned
  model shares its base's config and header, but training changes every tensor, so its first bytes differ; the
  whole digest reads a few MiB, never the gigabytes of the weights.

A folder posenc converted itself (a GGUF file, a bundled model, a lab run: :func:`posenc.hf.source.source_folder`)
already carries a digest of what it was converted from in its name (``SmolLM2-135M-Instruct.Q4_1-<sha256>``), so
its id stays ``<folder name>:<type>``: the cells committed under ``benchmarks/`` are keyed by it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

__all__ = ["SAMPLES", "TENSOR_BYTES", "WHOLE_FILE_BYTES", "content_digest", "model_id"]

WHOLE_FILE_BYTES = 64 << 20
"""Files up to this size are hashed whole (config, tokenizer, a tiny model's weights)."""
TENSOR_BYTES = 4096
"""How many bytes of each tensor of a large safetensors file are read."""
SAMPLES = 64
"""Blocks of :data:`TENSOR_BYTES` read at evenly spaced offsets of every large file."""


def _safetensors_header(f, size: int) -> tuple[bytes, list[tuple[int, int]]]:
    """The raw header of a safetensors file and every tensor's absolute ``(start, end)`` byte range (empty when the
    file is no readable safetensors file: its samples still go into the digest)."""
    f.seek(0)
    head = f.read(8)
    if len(head) < 8:
        return b"", []
    n = struct.unpack("<Q", head)[0]
    if n > min(size - 8, 100 << 20):
        return b"", []
    raw = f.read(n)
    try:
        meta = json.loads(raw)
        ranges = [(8 + n + int(v["data_offsets"][0]), 8 + n + int(v["data_offsets"][1]))
                  for k, v in sorted(meta.items()) if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return raw, []
    return raw, ranges


def _file_digest(path: Path, h) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}\0{size}\0".encode())
    with open(path, "rb") as f:
        if size <= WHOLE_FILE_BYTES:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
            return
        header, ranges = _safetensors_header(f, size) if path.suffix == ".safetensors" else (b"", [])
        h.update(header)
        offsets = [start for start, end in ranges if end > start]
        offsets += [i * (size - TENSOR_BYTES) // (SAMPLES - 1) for i in range(SAMPLES)]
        for off in offsets:
            f.seek(off)
            h.update(f.read(TENSOR_BYTES))


def content_digest(folder) -> str:
    """SHA-256 (hex) over the regular, non-hidden files at the top of ``folder``, by name (module docstring)."""
    h = hashlib.sha256()
    for p in sorted(Path(folder).iterdir(), key=lambda p: p.name):
        if p.is_file() and not p.name.startswith("."):
            _file_digest(p, h)
    return h.hexdigest()


def model_id(source, folder, model_type: str) -> str:
    """The model's name in cache keys: ``<folder name>:<type>`` for a folder posenc converted from ``source`` (its
    name holds the digest of the GGUF or run), ``hf-<content digest>:<type>`` for a folder given as it is."""
    folder = Path(folder)
    if Path(source).resolve() != folder.resolve():  # a GGUF, bundled model or lab run, converted into the cache
        return f"{folder.name}:{model_type}"
    return f"hf-{content_digest(folder)[:24]}:{model_type}"
