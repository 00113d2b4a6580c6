"""Tokenizers of the lab (bytes, or a byte-level BPE) and the encoding of documents into one token stream."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from posenc._util import check_positive_int
from posenc.data.corpora import Document
from posenc.runtime.atomic import atomic_write_bytes


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0..255 are bytes; with ``bos=True`` (default) id 256 is a BOS /
    document-separator token, so ``vocab_size`` is 257 (256 without it). ``decode`` drops specials
    and replaces invalid UTF-8 (a model may emit half a character)."""

    name = "byte"

    def __init__(self, bos: bool = True):
        self.bos_id = 256 if bos else None
        self.vocab_size = 257 if bos else 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def separator(self) -> list[int]:
        """Ids put between documents: ``[bos_id]``, or a blank line without BOS."""
        return [self.bos_id] if self.bos_id is not None else self.encode("\n\n")

    def config(self) -> dict:
        return {"name": self.name, "bos": self.bos_id is not None}


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) from Hugging Face ``tokenizers``; ``<|endoftext|>`` (id 0) is the
    BOS / document separator. Train with :meth:`train`, persist with :meth:`save` / :meth:`load` (the
    ``tokenizers`` JSON format)."""

    name = "bpe"
    SPECIAL = "<|endoftext|>"

    def __init__(self, tok):
        self._tok = tok
        self.vocab_size = tok.get_vocab_size()
        self.bos_id = tok.token_to_id(self.SPECIAL)

    @classmethod
    def train(cls, texts, vocab_size: int = 4096, min_frequency: int = 2) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        vocab_size = check_positive_int("vocab_size", vocab_size, minimum=258)
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=[cls.SPECIAL], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(list(texts), trainer=trainer)
        return cls(tok)

    @property
    def backend(self):
        """The ``tokenizers.Tokenizer`` behind it (what :func:`posenc.hf.export.export` hands to transformers)."""
        return self._tok

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_bytes(Path(path), self._tok.to_str().encode())

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts)]

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def separator(self) -> list[int]:
        return [self.bos_id]

    def config(self) -> dict:
        return {"name": self.name, "vocab_size": self.vocab_size}


def _make_bpe(path=None, texts=None, vocab_size: int = 4096, min_frequency: int = 2) -> BPETokenizer:
    if path is not None:
        return BPETokenizer.load(path)
    if texts is None:
        raise ValueError("tokenizer 'bpe' needs path= (a saved tokenizer.json) or texts= to train on")
    return BPETokenizer.train(texts, vocab_size, min_frequency)


TOKENIZERS: dict[str, Callable] = {"byte": ByteTokenizer, "bpe": _make_bpe}


def make_tokenizer(name: str = "byte", **kwargs):
    """Tokenizer by name: ``byte`` (``bos=True``) or ``bpe`` (``path=`` to load, or ``texts=``,
    ``vocab_size=4096`` to train)."""
    if not isinstance(name, str) or name not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {sorted(TOKENIZERS)}, got {name!r}")
    try:
        return TOKENIZERS[name](**kwargs)
    except TypeError as exc:
        raise ValueError(f"tokenizer {name!r} does not take options {sorted(kwargs)} ({exc})") from None


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest array dtype for ids < vocab_size: uint8, uint16 or int32."""
    if vocab_size <= 256:
        return np.dtype(np.uint8)
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


def encode_documents(docs: list[Document], tokenizer) -> np.ndarray:
    """Token ids of ``docs`` joined as ``sep doc0 sep doc1 ...`` (a separator also starts the stream,
    so every document begins after a BOS), in :func:`token_dtype`."""
    dtype, sep = token_dtype(tokenizer.vocab_size), np.asarray(tokenizer.separator(), dtype=np.int64)
    if hasattr(tokenizer, "encode_batch"):
        encoded = [np.asarray(ids, dtype=np.int64) for ids in tokenizer.encode_batch([d.text for d in docs])]
    elif hasattr(tokenizer, "encode_array"):
        encoded = [tokenizer.encode_array(d.text) for d in docs]
    else:
        encoded = [np.asarray(tokenizer.encode(d.text), dtype=np.int64) for d in docs]
    parts = [p for ids in encoded for p in (sep, ids)]
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
