"""Tests for posenc.lab.data: corpora, split, tokenizers, cache, batches, evaluation windows."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

from posenc.lab import data as D

# ------------------------------------------------------------------------------------------- corpora


@pytest.fixture(scope="module")
def gutenberg():
    return D.load_corpus("gutenberg")


def test_gutenberg_is_real_text(gutenberg):
    total = sum(len(d.text.encode("utf-8")) for d in gutenberg)
    assert total > 1_000_000
    assert len(gutenberg) >= 40
    names = [d.name for d in gutenberg]
    assert len(set(names)) == len(names)
    hamlet = [d for d in gutenberg if d.name.endswith("/hamlet_gut")]
    assert len(hamlet) == 1 and "HAMLET" in hamlet[0].text and "Ophelia" in hamlet[0].text
    assert not any("metadata" in n for n in names)  # the package's metadata.txt is not a text
    for d in gutenberg:
        assert "*** START OF" not in d.text and "<html" not in d.text.lower()


def test_gutenberg_editions_share_a_group(gutenberg):
    groups = {d.name.split("/")[-1]: d.key for d in gutenberg}
    assert groups["hamlet_gut"] == groups["hamlet_gut_f"] == "hamlet"
    assert groups["twelfe-night_gut_f"] == groups["twelfth_night_gut"]


def test_strip_gutenberg_and_markup():
    text = ("The Project Gutenberg EBook of X\r\nlicence\r\n"
            "*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n"
            "Body line.\r\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\nmore licence\r\n")
    assert D.strip_gutenberg(text) == "Body line.\n"
    assert D.strip_gutenberg("plain\n") == "plain\n"
    html = ("<html><head><title>t</title></head>"
            "<body><p>A &amp; B</p><script>x=1</script><p>C</p></body></html>")
    assert D.strip_markup(html) == "A & B\nC\n"


def test_user_folder_corpus(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha text\n")
    (tmp_path / "sub" / "b.md").write_text("beta ünïcode\n")
    (tmp_path / "page.html").write_text("<html><body><p>gamma</p></body></html>")
    (tmp_path / ".hidden.txt").write_text("secret\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    (tmp_path / "empty.txt").write_text("  \n")
    docs = D.load_corpus(str(tmp_path))
    assert [d.name for d in docs] == ["a.txt", "page.html", "sub/b.md"]
    assert docs[1].text == "gamma\n" and docs[2].text == "beta ünïcode\n"
    single = D.load_corpus(tmp_path / "a.txt")
    assert [(d.name, d.text) for d in single] == [("a.txt", "alpha text\n")]
    with pytest.raises(ValueError, match="corpus"):
        D.load_corpus(str(tmp_path / "missing"))


def test_stdlib_corpus_capped():
    docs = D.load_corpus("stdlib", max_bytes=300_000)
    assert 5 <= len(docs)
    assert sum(len(d.text.encode("utf-8")) for d in docs) <= 300_000 + 1000 * len(docs)  # decode may grow
    names = [d.name for d in docs]
    assert names == sorted(names)
    for n in names:
        parts = n.split("/")
        assert n.endswith(".py") and not ({"test", "tests", "site-packages"} & set(parts))


# --------------------------------------------------------------------------------------------- split


def test_split_deterministic_disjoint_nonempty(gutenberg):
    a = D.split_documents(gutenberg)
    shuffled = list(gutenberg)
    random.Random(0).shuffle(shuffled)
    b = D.split_documents(shuffled)
    names = {s: {d.name for d in a[s]} for s in D.SPLITS}
    assert names == {s: {d.name for d in b[s]} for s in D.SPLITS}  # order-independent
    assert all(names[s] for s in D.SPLITS)
    assert not (names["train"] & names["val"] or names["train"] & names["test"])
    assert not names["val"] & names["test"]
    assert set().union(*names.values()) == {d.name for d in gutenberg}
    groups = {s: {d.key for d in a[s]} for s in D.SPLITS}
    assert not (groups["train"] & groups["test"] or groups["train"] & groups["val"])
    train_bytes = sum(len(d.text) for d in a["train"])
    assert 0.7 < train_bytes / sum(len(d.text) for d in gutenberg) < 0.97


def test_split_small_corpus_is_chunked():
    text = "".join(f"line {i} of a single long document\n" for i in range(3000))
    parts = D.split_documents([D.Document("only", text)])
    assert all(parts[s] for s in D.SPLITS)
    chunks = sorted((d for s in D.SPLITS for d in parts[s]), key=lambda d: int(d.name.split("#")[1]))
    assert "".join(d.text for d in chunks) == text  # chunks tile the document, no overlap
    with pytest.raises(ValueError, match="fractions"):
        D.split_documents([D.Document("x", text)], fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="too small"):
        D.split_documents([D.Document("x", "ab")])


# ----------------------------------------------------------------------------------------- tokenizers


def test_byte_tokenizer_roundtrip():
    tok = D.make_tokenizer("byte")
    text = "Hamlet — «to be» 生存还是毁灭 🙂\n"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == text
    assert tok.vocab_size == 257 and tok.bos_id == 256 and tok.decode([256, *ids]) == text
    assert D.ByteTokenizer(bos=False).vocab_size == 256
    assert tok.decode(tok.encode("ab") + [0xE2]) == "ab\ufffd"  # broken UTF-8 -> replacement char
    assert D.token_dtype(256) == np.uint8 and D.token_dtype(257) == np.uint16
    assert D.token_dtype(70000) == np.int32
    with pytest.raises(ValueError, match="tokenizer"):
        D.make_tokenizer("nope")


def test_bpe_trains_and_roundtrips(tmp_path):
    texts = ["To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"] * 20
    tok = D.make_tokenizer("bpe", texts=texts, vocab_size=300, min_frequency=1)
    assert 258 <= tok.vocab_size <= 300
    sample = "To be or not to be — ça va? 🙂"
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample
    assert len(tok.encode(texts[0])) < len(texts[0]) / 2  # merges were learned
    tok.save(tmp_path / "tok.json")
    json.loads((tmp_path / "tok.json").read_text())
    loaded = D.make_tokenizer("bpe", path=tmp_path / "tok.json")
    assert loaded.encode(sample) == ids and loaded.bos_id == tok.bos_id == 0


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
    for s in D.SPLITS:
        arr, st = first.split(s), first.stats[s]
        assert arr.dtype == np.uint16 and arr.ndim == 1 and arr.size == st["tokens"]
        assert int((arr == 256).sum()) == st["documents"] > 0  # one BOS before each document
    assert sum(first.stats[s]["documents"] for s in D.SPLITS) == 30
    text = first.tokenizer.decode(first.train)
    assert "Document" in text and "words and more words." in text

    monkeypatch.setattr(D, "_build", lambda *a, **k: pytest.fail("cache miss: rebuilt"))
    second = D.prepare(str(tiny_corpus), "byte", cache)
    assert second.from_cache and second.path == first.path
    assert isinstance(second.train, np.memmap)
    assert {f: f.stat().st_mtime_ns for f in files} == mtimes
    for s in D.SPLITS:
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


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    D._atomic_write_bytes(target, b"old")

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        D._atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


def test_prepare_bpe(tiny_corpus, tmp_path):
    p = D.prepare(str(tiny_corpus), "bpe", tmp_path / "c", tokenizer_kwargs={"vocab_size": 300})
    assert (p.path / "tokenizer.json").exists() and p.vocab_size <= 300
    q = D.prepare(str(tiny_corpus), "bpe", tmp_path / "c", tokenizer_kwargs={"vocab_size": 300})
    assert q.from_cache and q.tokenizer.encode("more words") == p.tokenizer.encode("more words")
    assert "words and more words." in q.tokenizer.decode(q.val)


# ----------------------------------------------------------------------------------------- batches


def test_batch_iterator_resumes_exactly():
    tokens = np.arange(5000, dtype=np.uint16)
    full = [b for _, b in zip(range(7), D.batch_iterator(tokens, 4, 16, seed=3))]
    resumed = list(D.batch_iterator(tokens, 4, 16, seed=3, start_step=4, num_steps=3))
    for (x1, y1), (x2, y2) in zip(full[4:], resumed):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    x, y = full[0]
    assert x.dtype == torch.long and x.shape == (4, 16)
    assert torch.equal(y, x + 1)  # tokens are arange, so a window is consecutive and y is x shifted
    other = next(D.batch_iterator(tokens, 4, 16, seed=4))
    assert not torch.equal(other[0], x)
    assert not torch.equal(full[1][0], x)


def test_batch_rank_sharding():
    tokens = np.random.default_rng(0).integers(0, 257, 3000).astype(np.uint16)
    gx, gy = D.get_batch(tokens, 8, 32, seed=1, step=5)
    parts = [D.get_batch(tokens, 8, 32, seed=1, step=5, rank=r, world_size=4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), gx)
    assert torch.equal(torch.cat([p[1] for p in parts]), gy)
    it = D.batch_iterator(tokens, 8, 32, seed=1, start_step=5, rank=2, world_size=4)
    assert torch.equal(next(it)[0], parts[2][0])
    with pytest.raises(ValueError, match="world_size"):
        D.get_batch(tokens, 6, 32, 1, 0, world_size=4)
    with pytest.raises(ValueError, match="rank"):
        D.get_batch(tokens, 8, 32, 1, 0, rank=4, world_size=4)
    with pytest.raises(ValueError, match="seq_len"):
        D.get_batch(tokens[:10], 2, 32, 1, 0)


def test_eval_windows_cover_targets():
    tokens = np.arange(1000)
    wins = list(D.eval_windows(tokens, 100))
    assert len(wins) == 9 and all(f == 0 and len(w) == 101 for w, f in wins)
    np.testing.assert_array_equal(wins[1][0], np.arange(100, 201))
    counted = []
    for w, f in D.eval_windows(tokens, 100, mode="sliding", stride=30):
        assert len(w) == 101
        counted += w[1:][f:].tolist()
    assert counted == list(range(1, len(counted) + 1)) and len(counted) > 950  # each target once
    capped = list(D.eval_windows(tokens, 100, max_windows=3))
    assert [int(w[0]) for w, _ in capped] == [0, 400, 800]
    with pytest.raises(ValueError, match="mode"):
        list(D.eval_windows(tokens, 100, mode="bogus"))
    with pytest.raises(ValueError, match="stride"):
        list(D.eval_windows(tokens, 100, mode="sliding", stride=101))
