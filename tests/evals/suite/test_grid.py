"""The suite's grid on a tiny random Llama (byte tokenizer saved as its own): results and report, resume after an
interruption without recomputing a finished cell, one writer per folder, per-length parameters, pruning."""

import json

import pytest
import torch
import transformers

from posenc.evals.records import EvalRecord, RetrievalRecord
from posenc.evals.suite import ContextSpec, SuitePreset, run_suite
from posenc.evals.suite import grid as grid_mod
from posenc.evals.suite import spec as spec_mod
from posenc.runtime.cells import CellStore
from posenc.runtime.lock import FolderInUseError, FolderLock

L = 1024


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from posenc.hf.export import byte_tokenizer

    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=260, max_position_embeddings=L)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def _preset(tiny, **kw):
    contexts = (ContextSpec("book", ("niah",), seeds=1, target=32), ContextSpec("noise", ("passkey",), seeds=1))
    base = dict(name="tiny", description="test", model=str(tiny), lengths=(1024, 2048),
                methods=("none", "selfextend", "rerope+logn"), contexts=contexts, reference_length=1024)
    return SuitePreset(**{**base, **kw})


def test_results_report_and_schema(tiny, tmp_path):
    res = run_suite(_preset(tiny), tmp_path, progress=False, log=lambda m: None)
    for name in ("results.json", "report.md", "report.html", "effective_length.png", "by_length.png",
                 "depth_heatmaps.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["meta"]["cells"] == 12 == len(CellStore(tmp_path / "cells"))
    recs = on_disk["records"]
    assert [(r["method"], r["eval_len"]) for r in recs] == [(m, n) for m in ("none", "selfextend", "rerope+logn")
                                                           for n in (1024, 2048)]
    for r in recs:
        assert EvalRecord.from_dict(r).to_dict() == r
        assert r["ppl"] > 1 and r["tokens"] == 32 and r["retrieval"]["n"] == 7 and r["train_len"] == L
        assert set(r["tasks"]) == {"niah_mk", "niah_mq", "passkey"} and r["prefill_s"] > 0
    for r in on_disk["retrieval"]:
        assert RetrievalRecord.from_dict(r).to_dict() == r and 0 <= r["depth_bin"][0] < 1
    # per-length parameters: SelfExtend groups positions only where the length needs it
    se = {r["eval_len"]: r["params"] for r in recs if r["method"] == "selfextend"}
    assert se[1024]["group"] == 1 and se[2048]["group"] == 4 and se[2048]["window"] == L // 2
    assert set(res["effective"]) == {"none", "selfextend", "rerope+logn"}
    assert res["reference"]["length"] == 1024 and res["reference"]["threshold"] == pytest.approx(
        0.85 * res["reference"]["retrieval"])
    md = (tmp_path / "report.md").read_text()
    assert md.index("effective_length.png") < md.index("Perplexity / retrieval by length")  # headline first
    assert "<details>" in (tmp_path / "report.html").read_text()


def test_an_interrupted_run_resumes_without_recomputing_a_cell(tiny, tmp_path, monkeypatch):
    from posenc.evals.suite import runner as cells

    real = cells.run_context
    calls = []

    def flaky(*a, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(cells, "run_context", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_suite(_preset(tiny), tmp_path / "a", progress=False, log=lambda m: None)
    assert len(CellStore(tmp_path / "a" / "cells")) == 4  # the four finished cells are kept
    calls.clear()
    monkeypatch.setattr(cells, "run_context", real)
    counted = []
    monkeypatch.setattr(cells, "run_context", lambda *a, **kw: counted.append(1) or real(*a, **kw))
    resumed = run_suite(_preset(tiny), tmp_path / "a", progress=False, log=lambda m: None)
    assert len(counted) == 8  # only the eight unfinished cells ran
    clean = run_suite(_preset(tiny), tmp_path / "b", progress=False, log=lambda m: None)
    strip = [{k: v for k, v in r.items() if k not in ("prefill_s", "decode_tok_s", "loadavg", "peak_rss_mb")}
             for r in resumed["records"]]
    assert strip == [{k: v for k, v in r.items() if k not in ("prefill_s", "decode_tok_s", "loadavg", "peak_rss_mb")}
                     for r in clean["records"]]
    counted.clear()
    run_suite(_preset(tiny), tmp_path / "a", progress=False, log=lambda m: None)
    assert counted == []  # everything finished: nothing recomputed


def test_a_report_of_an_unfinished_run_says_what_is_not_run_yet(tiny, tmp_path, monkeypatch):
    """``report_only`` (``posenc bench --report-only``) computes no cell: its results hold the finished cells, and
    ``meta["missing"]`` counts the unfinished ones per (method, length); a pair that pruning would judge on
    unfinished cells counts as not run yet, not as left out. Once the run ends, the report equals the run's own.
    A folder with no finished cell is refused with the way out, not drawn as an empty report."""
    from posenc.evals.suite import runner as cells

    real = cells.run_context
    calls = []

    def interrupted(*a, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*a, **kw)

    preset = _preset(tiny, prune_from=2048)
    monkeypatch.setattr(cells, "run_context", lambda *a, **kw: pytest.fail("report_only ran a cell"))
    with pytest.raises(ValueError, match="no cell of 'tiny' is finished in .*empty.*name a folder that holds its"):
        run_suite(preset, tmp_path / "empty", progress=False, log=lambda m: None, report_only=True)
    assert not (tmp_path / "empty" / "results.json").exists()  # an empty folder is refused, not reported as empty
    monkeypatch.setattr(cells, "run_context", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_suite(preset, tmp_path, progress=False, log=lambda m: None)
    monkeypatch.setattr(cells, "run_context", lambda *a, **kw: pytest.fail("report_only ran a cell"))
    res = run_suite(preset, tmp_path, progress=False, log=lambda m: None, report_only=True)
    assert res["meta"]["complete"] is False and res["meta"]["cells"] == 4 and res["meta"]["left_out"] == {}
    assert res["meta"]["missing"] == {"rerope+logn@1024": 2, "none@2048": 2, "selfextend@2048": 2,
                                      "rerope+logn@2048": 2}
    assert [(r["method"], r["eval_len"]) for r in res["records"]] == [("none", 1024), ("selfextend", 1024)]
    assert res["effective"]["rerope+logn"]["unfinished"] == [1024, 2048]
    assert not res["effective"]["none"]["complete"]
    md = (tmp_path / "report.md").read_text()
    assert "Not finished: this report was written before the run ended (4 cells finished, 8 not run yet" in md
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["missing"] == res["meta"]["missing"]
    monkeypatch.setattr(cells, "run_context", real)
    done = run_suite(preset, tmp_path, progress=False, log=lambda m: None)
    assert done["meta"]["complete"] is True and done["meta"]["missing"] == {}
    again = run_suite(preset, tmp_path, progress=False, log=lambda m: None, report_only=True)
    assert again["records"] == done["records"] and again["effective"] == done["effective"]
    assert again["meta"]["left_out"] == done["meta"]["left_out"]


def test_report_only_is_for_the_real_model_presets(tmp_path, capsys):
    from posenc.cli import main

    assert main(["bench", "--preset", "quick", "--out", str(tmp_path / "o"), "--report-only"]) == 2
    assert "--report-only is for the real-model presets" in capsys.readouterr().err


def test_a_second_writer_is_refused(tiny, tmp_path):
    with FolderLock(tmp_path / "out"):
        with pytest.raises(FolderInUseError, match="suite run folder"):
            run_suite(_preset(tiny), tmp_path / "out", progress=False, log=lambda m: None)


def test_a_preset_sharing_another_runs_cells_reads_them_and_counts_only_its_own(tiny, tmp_path, monkeypatch):
    """``cells_dir``: a smaller preset (one of the big run's rows plus a row of its own) reads the cells the big
    run finished, computes only its new row's, writes them into the shared folder, and its results count only its
    own cells; the folder holding the shared cells is locked while it runs."""
    from posenc.evals.suite import runner as cells

    big = tmp_path / "big"
    run_suite(_preset(tiny), big, progress=False, log=lambda m: None)
    before = len(CellStore(big / "cells"))
    real = cells.run_context
    counted = []
    monkeypatch.setattr(cells, "run_context", lambda *a, **kw: counted.append(1) or real(*a, **kw))
    small = _preset(tiny, name="small", methods=("none", "selfextend", "yarn"))
    res = run_suite(small, tmp_path / "small", cells_dir=big / "cells", progress=False, log=lambda m: None)
    assert len(counted) == 4  # yarn at 2 lengths x 2 contexts; none and selfextend were read
    assert len(CellStore(big / "cells")) == before + 4 and not (tmp_path / "small" / "cells").exists()
    assert res["meta"]["cells"] == 12  # its own 3 rows x 2 lengths x 2 contexts, not the 16 in the folder
    assert [r["method"] for r in res["records"]] == ["none", "none", "selfextend", "selfextend", "yarn", "yarn"]
    alone = run_suite(small, tmp_path / "alone", progress=False, log=lambda m: None)
    keep = ("method", "eval_len", "ppl", "retrieval", "params")
    assert [{k: r[k] for k in keep} for r in res["records"]] == [{k: r[k] for k in keep} for r in alone["records"]]
    with FolderLock(big):
        with pytest.raises(FolderInUseError, match="suite run folder"):
            run_suite(small, tmp_path / "other", cells_dir=big / "cells", progress=False, log=lambda m: None)


def test_cells_flag_is_for_the_real_model_presets(tmp_path, capsys):
    from posenc.cli import main

    assert main(["bench", "--preset", "quick", "--out", str(tmp_path / "o"), "--cells", str(tmp_path / "c")]) == 2
    assert "--cells is for the real-model presets" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_pruning_leaves_out_methods_that_failed_at_the_previous_length(tiny, tmp_path):
    """With prune_from, a method runs at a length only if its retrieval at the previous length reached the
    threshold; the reason is recorded."""
    preset = _preset(tiny, prune_from=2048)
    m = spec_mod.load_facts(preset.model)
    store = CellStore(tmp_path)

    def put(method, n, right):
        params = spec_mod.method_params(method, m.train_len, n, m.head_dim, m.base, preset.params)
        for spec in preset.contexts:
            store.put(spec_mod.cell_key(m.model_id, method, params, n, spec, 0, False),
                      {"answers": [{"correct": right, "kind": "passkey", "chance": 0.0}] * 2})

    put("none", 1024, True)
    put("selfextend", 1024, True)
    put("rerope+logn", 1024, False)
    assert grid_mod._pruned(store, m, preset, "selfextend", 2048) is None
    why = grid_mod._pruned(store, m, preset, "rerope+logn", 2048)
    assert "retrieval 0.00 at 1024 was below 0.85 x the untouched model's 1.00" in why
    assert grid_mod._pruned(store, m, preset, "none", 2048) is None  # the baseline always runs
    assert grid_mod._pruned(store, m, preset, "rerope+logn", 1024) is None  # before prune_from
