"""posenc.evals.suite.spec: a cell key names the model by its content (``load_facts``' ``model_id``), so two
different models saved in folders of one name (``a/model``, ``b/model``) sharing a cells folder never read each
other's cells, and the same model copied elsewhere reads its own."""

from __future__ import annotations

import shutil

import pytest

from posenc.evals.suite import ContextSpec, SuitePreset, run_suite
from posenc.evals.suite.spec import load_facts
from tests.support.tiny_hf import make_model

L = 1024


@pytest.fixture(scope="module")
def ab(tmp_path_factory):
    """Two tiny Llamas of one architecture (seeds 0 and 1, the byte tokenizer saved as their own) in ``a/model``
    and ``b/model``, and ``a`` copied to ``c/model``."""
    from posenc.hf.export import byte_tokenizer

    root = tmp_path_factory.mktemp("ab")
    for name, seed in (("a", 0), ("b", 1)):
        make_model("llama", seed=seed, vocab_size=260, max_position_embeddings=L).save_pretrained(root / name / "model")
        byte_tokenizer().save_pretrained(root / name / "model")
    shutil.copytree(root / "a" / "model", root / "c" / "model")
    return root


def _preset(folder):
    return SuitePreset(name="ab", description="test", model=str(folder), lengths=(L,), methods=("none",),
                       contexts=(ContextSpec("book", ("passkey",), seeds=1, target=32),), reference_length=L)


def test_models_in_folders_of_one_name_get_their_own_ids(ab):
    a, b, c = (load_facts(ab / x / "model").model_id for x in "abc")
    assert a != b and a == c


def test_a_shared_cells_folder_never_gives_one_model_the_others_numbers(ab, tmp_path):
    """A's run fills the shared cells; B's report-only finds none of its own (refused, not A's numbers), B's run
    computes its own; A's copy in ``c/model`` reads A's cells."""
    cells = tmp_path / "cells"
    quiet = {"progress": False, "log": lambda m: None}
    a = run_suite(_preset(ab / "a" / "model"), tmp_path / "A", cells_dir=cells, **quiet)
    with pytest.raises(ValueError, match="no cell of 'ab' is finished"):
        run_suite(_preset(ab / "b" / "model"), tmp_path / "B", cells_dir=cells, report_only=True, **quiet)
    b = run_suite(_preset(ab / "b" / "model"), tmp_path / "B", cells_dir=cells, **quiet)
    assert b["records"][0]["ppl"] != a["records"][0]["ppl"]
    c = run_suite(_preset(ab / "c" / "model"), tmp_path / "C", cells_dir=cells, report_only=True, **quiet)
    assert c["meta"]["complete"] and c["records"][0]["ppl"] == a["records"][0]["ppl"]


def test_a_derived_preset_takes_lengths_bins_and_targets_from_the_trained_length():
    from posenc.evals.suite.presets import SUITE_PRESETS

    model, short = SUITE_PRESETS["model"], SUITE_PRESETS["smollm2"]
    assert model.derived and short.derived
    got = model.sized(2048)
    assert got.lengths == (1024, 2048, 4096, 8192) and got.reference_length == 2048 and not got.derived
    keys = next(c for c in got.contexts if "keys" in c.generators)
    assert keys.options["keys"] == {"n_keys": 2, "bins": [[64, 512], [512, 2048], [2048, 8192]]}
    assert keys.seeds * keys.options["keys"]["n_keys"] >= 24  # 24 keys per (method, length)
    assert next(c for c in got.contexts if c.haystack == "book").target == 2048 // 16
    # SmolLM2's named preset by the same rule: 8k and 16k, the 512-token passages and the 256-2k near bin
    s = short.sized(8192)
    assert s.lengths == (8192, 16384) and s.reference_length == 8192 and s.floor == 0.5
    assert next(c for c in s.contexts if c.haystack == "book").target == 512
    assert next(c for c in s.contexts if "keys" in c.generators).options["keys"]["bins"][0] == [256, 2048]
    # --lengths replaces the lengths and keeps L, the reference
    assert model.sized(2048, lengths=(4096, 1024)).lengths == (1024, 2048, 4096)


def test_a_fixed_preset_keeps_its_lengths_and_a_bad_target_is_refused():
    fixed = SuitePreset(name="f", description="t", lengths=(1024, 2048), reference_length=1024,
                        contexts=(ContextSpec("noise", ("passkey",)),))
    assert fixed.sized(4096).lengths == (1024, 2048) and fixed.sized(4096).reference_length == 1024
    bad = SuitePreset(name="b", description="t", length_factors=(1, 2), contexts=(ContextSpec("book", ("passkey",),
                                                                                             target="M/16"),))
    with pytest.raises(ValueError, match="'L/<d>'"):
        bad.sized(1024)


def test_a_contexts_reach_is_in_its_cell_key_only_when_set():
    """A book context with a longer reach holds other passages: its cells never answer for the default's, and
    every cell computed before reach existed keeps its key."""
    from posenc.evals.suite.spec import ContextSpec, cell_key

    plain, far = ContextSpec("book", ("niah",), target=64), ContextSpec("book", ("niah",), target=64, reach=131072)
    a, b = (cell_key("m:llama", "none", {}, 4096, spec, 0, False) for spec in (plain, far))
    assert "reach" not in a and b == {**a, "reach": 131072}


def test_a_preset_cut_to_some_rows_keeps_each_contexts_rows_and_comparisons_to_them():
    """``SuitePreset.only``: a context naming rows keeps those among the kept rows, one naming none of them is
    dropped, one naming no rows stays; ``compare_to`` keeps the kept rows; the whole preset is left as it was."""
    every = ContextSpec("noise", ("keys",))
    some = ContextSpec("book", ("passkey",), target=32, methods=("none", "yarn"))
    other = ContextSpec("book", ("passkey",), target=32, first_seed=1, methods=("yarn",))
    whole = SuitePreset(name="cut", description="test", lengths=(L, 2 * L), methods=("none", "yarn"),
                        contexts=(every, some, other), reference_length=L, compare_to=("none", "yarn"))
    cut = whole.only(("none",), (L,))
    assert cut.methods == ("none",) and cut.lengths == (L,) and cut.compare_to == ("none",)
    assert cut.contexts == (every, ContextSpec("book", ("passkey",), target=32, methods=("none",)))
    assert whole.contexts == (every, some, other) and whole.compare_to == ("none", "yarn")
