"""posenc.evals.tune.objective: the suite objective's contexts (a book one needed, a noise one adds retrieval and
no loss)."""

from __future__ import annotations

import pytest

from tests.evals.tune.test_search import tiny  # noqa: F401 - fixtures

N = 512


def test_contexts_take_a_haystack_and_need_a_book_one():
    from posenc.cli.tune import _context
    from posenc.evals.tune.objective import DEFAULT_CONTEXTS, context_triples

    assert context_triples([("passkey", 0), ("noise", "passkey", 1)]) == (("book", "passkey", 0),
                                                                          ("noise", "passkey", 1))
    assert DEFAULT_CONTEXTS == (("book_heldout", "passkey", 0), ("noise", "passkey", 1000))
    assert context_triples([("book_heldout", "niah", 2)]) == (("book_heldout", "niah", 2),)
    with pytest.raises(ValueError, match="need a book context"):
        context_triples([("noise", "passkey", 0)])
    with pytest.raises(ValueError, match="haystack one of"):
        context_triples([("web", "passkey", 0)])
    assert _context("noise:passkey:1") == ("noise", "passkey", 1)
    assert _context("niah:2") == ("book", "niah", 2) and _context("passkey") == ("book", "passkey", 0)
    assert _context("book:niah") == ("book", "niah", 0)
    import argparse

    for bad in ("noise:passkey:x", "a:b:c:d", ":1"):
        with pytest.raises(argparse.ArgumentTypeError, match="HAYSTACK"):
            _context(bad)


def test_a_noise_context_adds_retrieval_and_no_loss(tiny, tmp_path):  # noqa: F811 - the fixture
    """The default contexts: a book pass key (its target passage is the loss, with a t interval over its 64-token
    blocks) and a noise pass key (retrieval only); two book contexts: the interval is over the contexts."""
    from posenc.evals.tune.objective import TuneObjective

    obj = TuneObjective(str(tiny), N, tmp_path / "cells", target=128)
    row = obj.evaluate("yarn", {"factor": 2.0})
    book, noise = (obj.store.get(obj.key("yarn", {"factor": 2.0}, *c)) for c in obj.contexts)
    assert noise["loss"] is None and noise["block_losses"] is None and len(noise["answers"]) == 1
    assert len(book["block_losses"]) == 2 and row["loss"] == pytest.approx(book["loss"])
    assert row["loss_over"] == "blocks" and row["loss_lo"] < row["loss"] < row["loss_hi"]
    assert row["queries"] == 2 and row["contexts"] == 2 and obj.forwards == 2
    two = TuneObjective(str(tiny), N, tmp_path / "cells", contexts=(("book_heldout", "passkey", 0), ("passkey", 1)),
                        target=128)
    r2 = two.evaluate("yarn", {"factor": 2.0})
    assert two.forwards == 1  # the held-out book pass key 0 cell is shared with the first objective
    assert r2["loss_over"] == "contexts" and r2["loss_lo"] is not None


def test_a_shared_cells_folder_never_gives_one_model_the_others_numbers(tmp_path):
    """Two different models saved as ``a/model`` and ``b/model`` (one architecture, two seeds) share a cells
    folder: B computes its own cells (A's are not its), and A copied to ``c/model`` reads A's."""
    import shutil

    from posenc.evals.tune.objective import TuneObjective
    from posenc.hf.export import byte_tokenizer
    from tests.support.tiny_hf import make_model

    for name, seed in (("a", 0), ("b", 1)):
        make_model("llama", seed=seed, vocab_size=260, max_position_embeddings=256).save_pretrained(
            tmp_path / name / "model")
        byte_tokenizer().save_pretrained(tmp_path / name / "model")
    shutil.copytree(tmp_path / "a" / "model", tmp_path / "c" / "model")
    contexts = (("passkey", 0),)
    rows = {}
    for name in "abc":
        obj = TuneObjective(str(tmp_path / name / "model"), N, tmp_path / "cells", contexts=contexts, target=32)
        rows[name] = (obj.evaluate("none", {}), obj.forwards)
    assert rows["a"][1] == 1 and rows["b"][1] == 1 and rows["c"][1] == 0  # B ran its own prefill; the copy none
    assert rows["b"][0]["loss"] != rows["a"][0]["loss"] and rows["c"][0]["loss"] == rows["a"][0]["loss"]
