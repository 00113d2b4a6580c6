"""posenc.data.prepare: prepare, the on-disk cache and its atomic writes, and a missing corpus path."""

from __future__ import annotations

import numpy as np
import pytest

from posenc.data import prepare as D
from posenc.data.corpora import SPLITS

# ----------------------------------------------------------------------------------------- prepare


@pytest.fixture()
def tiny_corpus(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(30):
        (root / f"doc{i:02d}.txt").write_text(f"Document {i}. " + "words and more words. " * (20 + i))
    return root


def test_prepare_builds_then_hits_cache(tiny_corpus, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = D.prepare(str(tiny_corpus), "byte", cache)
    assert not first.from_cache
    files = sorted(first.path.iterdir())
    assert [f.name for f in files] == ["meta.json", "test.bin", "train.bin", "val.bin"]
    mtimes = {f: f.stat().st_mtime_ns for f in files}
    for s in SPLITS:
        arr, st = first.split(s), first.stats[s]
        assert arr.dtype == np.uint16 and arr.ndim == 1 and arr.size == st["tokens"]
        assert int((arr == 256).sum()) == st["documents"] > 0  # one BOS before each document
    assert sum(first.stats[s]["documents"] for s in SPLITS) == 30
    text = first.tokenizer.decode(first.train)
    assert "Document" in text and "words and more words." in text

    monkeypatch.setattr(D, "_build", lambda *a, **k: pytest.fail("cache miss: rebuilt"))
    second = D.prepare(str(tiny_corpus), "byte", cache)
    assert second.from_cache and second.path == first.path
    assert isinstance(second.train, np.memmap)
    assert {f: f.stat().st_mtime_ns for f in files} == mtimes
    for s in SPLITS:
        np.testing.assert_array_equal(second.split(s), first.split(s))
    assert second.stats == first.stats


def test_prepare_key_tracks_sources_and_env(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "envcache"))
    assert D.default_cache_dir() == tmp_path / "envcache"
    a = D.prepare(str(tiny_corpus))
    assert a.path.parent == tmp_path / "envcache"
    (tiny_corpus / "doc00.txt").write_text("changed text, longer than before " * 3)
    b = D.prepare(str(tiny_corpus))
    assert b.path != a.path and not b.from_cache


def test_prepare_write_is_atomic(tiny_corpus, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    real, calls = D.encode_documents, []

    def failing(docs, tok):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("crash while writing the cache")
        return real(docs, tok)

    monkeypatch.setattr(D, "encode_documents", failing)
    with pytest.raises(RuntimeError, match="crash"):
        D.prepare(str(tiny_corpus), "byte", cache)
    (entry,) = list(cache.iterdir())
    assert not (entry / "meta.json").exists()  # incomplete entry is never taken for a cache hit
    assert not [f for f in entry.iterdir() if f.name.endswith(".tmp")]
    monkeypatch.setattr(D, "encode_documents", real)
    again = D.prepare(str(tiny_corpus), "byte", cache)
    assert not again.from_cache and (entry / "meta.json").exists()


def test_prepare_bpe(tiny_corpus, tmp_path):
    p = D.prepare(str(tiny_corpus), "bpe", tmp_path / "c", tokenizer_kwargs={"vocab_size": 300})
    assert (p.path / "tokenizer.json").exists() and p.vocab_size <= 300
    q = D.prepare(str(tiny_corpus), "bpe", tmp_path / "c", tokenizer_kwargs={"vocab_size": 300})
    assert q.from_cache and q.tokenizer.encode("more words") == p.tokenizer.encode("more words")
    assert "words and more words." in q.tokenizer.decode(q.val)


# ------------------------------------------------------------------------------------------------ data / eval / train
@pytest.mark.parametrize("corpus", ["/nonexistent/corpus.txt", "no_such_corpus"])
def test_missing_corpus_path_is_a_clear_error(corpus, tmp_path):
    from posenc.data.prepare import prepare

    with pytest.raises(ValueError, match=r"corpus must be one of .* or an existing file/folder"):
        prepare(corpus, "byte", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing cached
