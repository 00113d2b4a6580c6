"""The lab's data pipeline end to end: :func:`prepare` loads, splits, tokenizes and caches a corpus.

Pipeline: ``load_corpus`` -> list of :class:`~posenc.data.corpora.Document` -> ``split_documents``
(deterministic, by hash of the document's group) -> tokenizer -> one 1-D token array per split, cached
on disk by ``prepare``. The steps live in their own modules: corpora and the split in
:mod:`posenc.data.corpora`, tokenizers and ``encode_documents`` in :mod:`posenc.data.tokenizer`, training
batches and evaluation windows over the arrays in :mod:`posenc.data.batches`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from posenc.data.corpora import DEFAULT_FRACTIONS, SPLITS, corpus_fingerprint, load_corpus, split_documents
from posenc.data.tokenizer import TOKENIZERS, BPETokenizer, ByteTokenizer, encode_documents, make_tokenizer, token_dtype
from posenc.runtime.atomic import atomic_write_bytes

DATA_VERSION = 1
"""Bumped whenever cleaning, splitting or array layout changes; part of every cache key."""


def default_cache_dir() -> Path:
    """``$POSENC_CACHE`` or ``~/.cache/posenc``."""
    return Path(os.environ.get("POSENC_CACHE") or Path.home() / ".cache" / "posenc").expanduser()


@dataclass
class PreparedCorpus:
    """Token arrays of one corpus + tokenizer. ``train``/``val``/``test`` are read-only memmaps when
    loaded from cache. ``stats[split]`` holds ``documents``, ``bytes`` (UTF-8) and ``tokens``."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    tokenizer: object
    stats: dict
    path: Path
    from_cache: bool = False
    meta: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        return getattr(self, name)


def _build(corpus, tokenizer: str, corpus_kwargs: dict, tokenizer_kwargs: dict, fractions, out: Path) -> dict:
    splits = split_documents(load_corpus(corpus, **corpus_kwargs), fractions)
    if tokenizer == "bpe" and "path" not in tokenizer_kwargs:
        tok = make_tokenizer("bpe", texts=[d.text for d in splits["train"]], **tokenizer_kwargs)
    else:
        tok = make_tokenizer(tokenizer, **tokenizer_kwargs)
    if isinstance(tok, BPETokenizer):
        tok.save(out / "tokenizer.json")
    stats = {}
    for name in SPLITS:
        arr = encode_documents(splits[name], tok)
        atomic_write_bytes(out / f"{name}.bin", arr.tobytes())
        stats[name] = {"documents": len(splits[name]), "tokens": int(arr.size),
                       "bytes": sum(len(d.text.encode("utf-8")) for d in splits[name])}
    return {"dtype": token_dtype(tok.vocab_size).name, "tokenizer": tok.config(), "stats": stats,
            "documents": {name: [d.name for d in splits[name]] for name in SPLITS}}


def _load_array(path: Path, dtype: str) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def prepare(corpus: str | os.PathLike = "gutenberg", tokenizer: str = "byte", cache_dir=None, *,
            corpus_kwargs: dict | None = None, tokenizer_kwargs: dict | None = None,
            fractions=DEFAULT_FRACTIONS) -> PreparedCorpus:
    """Load, split, tokenize and cache a corpus; later calls memory-map the cached arrays.

    Cache folder: ``cache_dir / f"{corpus}-{tokenizer}-{key}"`` where ``key`` hashes
    :data:`DATA_VERSION`, the corpus (name or resolved path, kwargs, and the size+mtime of every
    source file), the tokenizer name and kwargs, and the split fractions. Every file is written
    atomically and ``meta.json`` last, so a cache entry counts only once it is complete.
    """
    corpus_kwargs, tokenizer_kwargs = dict(corpus_kwargs or {}), dict(tokenizer_kwargs or {})
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {sorted(TOKENIZERS)}, got {tokenizer!r}")
    ident = {"version": DATA_VERSION, "corpus": corpus_fingerprint(corpus, corpus_kwargs),
             "tokenizer": tokenizer, "tokenizer_kwargs": tokenizer_kwargs, "fractions": list(fractions)}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(str(corpus)).name or "corpus")[:40]
    out = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    out = out / f"{slug}-{tokenizer}-{key}"
    meta_path = out / "meta.json"
    from_cache = meta_path.exists()
    if from_cache:
        meta = json.loads(meta_path.read_text())
    else:
        meta = {"key": ident, **_build(corpus, tokenizer, corpus_kwargs, tokenizer_kwargs, fractions, out)}
        atomic_write_bytes(meta_path, json.dumps(meta, indent=1, default=str).encode())
    tok = (BPETokenizer.load(out / "tokenizer.json") if meta["tokenizer"]["name"] == "bpe"
           else ByteTokenizer(bos=meta["tokenizer"]["bos"]))
    arrays = {name: _load_array(out / f"{name}.bin", meta["dtype"]) for name in SPLITS}
    return PreparedCorpus(**arrays, tokenizer=tok, stats=meta["stats"], path=out, from_cache=from_cache,
                          meta=meta)
