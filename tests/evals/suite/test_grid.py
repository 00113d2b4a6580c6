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
from posenc.evals.suite.results import MACHINE_FIELDS
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
    # SelfExtend at L = 1024 (group 1) reads every pair as the untouched model does: it shares those 2 cells, its record
    # there is the untouched model's and the report says so; 12 (row, length, context) cells, 10 computed
    assert on_disk["meta"]["cells"] == 10 == len(CellStore(tmp_path / "cells"))
    assert on_disk["meta"]["same_as_untouched"] == ["selfextend@1024"]
    assert "Identity at its length, so sharing the untouched model's cells there: selfextend at 1k" in (
        tmp_path / "report.md").read_text()
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
    by = {(r["method"], r["eval_len"]): r for r in recs}
    for field in ("retrieval", "ppl", "tasks"):
        assert by[("selfextend", 1024)][field] == by[("none", 1024)][field]
    assert by[("rerope+logn", 1024)]["params"]["window"] < 1024  # binds at L: its own cells
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
    assert len(counted) == 6  # only the six unfinished cells ran (of 10: SelfExtend at L shares the untouched cells)
    clean = run_suite(_preset(tiny), tmp_path / "b", progress=False, log=lambda m: None)
    strip = [{k: v for k, v in r.items() if k not in MACHINE_FIELDS}
             for r in resumed["records"]]
    assert strip == [{k: v for k, v in r.items() if k not in MACHINE_FIELDS}
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
    # the 4 finished: the untouched model's 2 at L (SelfExtend's there too: the identity) and ReRoPE's 2 at L
    assert res["meta"]["missing"] == {"none@2048": 2, "selfextend@2048": 2, "rerope+logn@2048": 2}
    assert [(r["method"], r["eval_len"]) for r in res["records"]] == [("none", 1024), ("selfextend", 1024),
                                                                     ("rerope+logn", 1024)]
    assert res["effective"]["rerope+logn"]["unfinished"] == [2048]
    assert not res["effective"]["none"]["complete"]
    md = (tmp_path / "report.md").read_text()
    assert "Not finished: this report was written before the run ended (4 cells finished, 6 not run yet" in md
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
    own cells; the shared cells folder is locked while it runs."""
    from posenc.evals.suite import runner as cells

    big = tmp_path / "big"
    run_suite(_preset(tiny), big, progress=False, log=lambda m: None)
    before = len(CellStore(big / "cells"))
    real = cells.run_context
    counted = []
    monkeypatch.setattr(cells, "run_context", lambda *a, **kw: counted.append(1) or real(*a, **kw))
    small = _preset(tiny, name="small", methods=("none", "selfextend", "yarn"))
    res = run_suite(small, tmp_path / "small", cells_dir=big / "cells", progress=False, log=lambda m: None)
    # yarn at 2048 x 2 contexts; none and selfextend were read, and yarn at L (factor 1) is the untouched model's cells
    assert len(counted) == 2
    assert len(CellStore(big / "cells")) == before + 2 and not (tmp_path / "small" / "cells").exists()
    # its own 3 rows x 2 lengths x 2 contexts less the shared ones (SelfExtend and YaRN at L), not the 12 in the folder
    assert res["meta"]["cells"] == 8
    assert [r["method"] for r in res["records"]] == ["none", "none", "selfextend", "selfextend", "yarn", "yarn"]
    alone = run_suite(small, tmp_path / "alone", progress=False, log=lambda m: None)
    keep = ("method", "eval_len", "ppl", "retrieval", "params")
    assert [{k: r[k] for k in keep} for r in res["records"]] == [{k: r[k] for k in keep} for r in alone["records"]]
    with FolderLock(big / "cells"):  # a run writing the shared cells holds their folder's lock
        with pytest.raises(FolderInUseError, match="suite cells folder .*big/cells"):
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


# ------------------------------------------------------------------------------------------------ faults
def _counting(monkeypatch):
    """Count the prefills the suite runs (a resume runs only the missing cells)."""
    from posenc.evals.suite import runner as cells

    real = cells.run_context
    counted = []
    monkeypatch.setattr(cells, "run_context", lambda *a, **kw: counted.append(1) or real(*a, **kw))
    return counted


def _strip(records):
    return [{k: v for k, v in r.items() if k not in MACHINE_FIELDS}
            for r in records]


def test_a_damaged_cell_is_computed_again_not_a_keyerror(tiny, tmp_path, monkeypatch):
    """A cell that parses but whose value lost a field (``KeyError: 'answers'``, 32 lines, no file named) is computed
    again, like a truncated one; only that cell runs, and the results equal the undamaged run's."""
    first = run_suite(_preset(tiny), tmp_path, progress=False, log=lambda m: None)
    path = sorted((tmp_path / "cells").glob("*.json"))[3]
    row = json.loads(path.read_text())
    del row["value"]["answers"]
    path.write_text(json.dumps(row))
    counted = _counting(monkeypatch)
    again = run_suite(_preset(tiny), tmp_path, progress=False, log=lambda m: None)
    assert len(counted) == 1 and "answers" in json.loads(path.read_text())["value"]
    assert _strip(again["records"]) == _strip(first["records"])
    assert list((tmp_path / "cells").glob(".*.tmp")) == []


_KILLED_WRITER = """
import os, signal, sys, json
from posenc.runtime import atomic
from posenc.runtime.cells import CellStore
atomic.os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # killed with the temp file written, not moved
CellStore(sys.argv[1]).put(json.loads(sys.argv[2]), {"answers": []})
"""


def test_a_resume_removes_the_temp_files_of_killed_writers(tiny, tmp_path, monkeypatch):
    """A writer killed inside a cell write (a real SIGKILL) leaves ``.<cell>.json.*.tmp``; the resume computes the
    missing cells and removes it."""
    import subprocess
    import sys

    from posenc.evals.suite import runner as cells

    real = cells.run_context
    calls = []

    def interrupted(*a, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(cells, "run_context", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_suite(_preset(tiny), tmp_path, progress=False, log=lambda m: None)
    r = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path / "cells"), json.dumps({"a": 1})],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr
    assert len(list((tmp_path / "cells").glob(".*.json.*.tmp"))) == 1
    counted = _counting(monkeypatch)
    run_suite(_preset(tiny), tmp_path, progress=False, log=lambda m: None)
    # 10 cells: at L = 1024 SelfExtend's parameters are the identity, so it shares the untouched model's 2 cells
    assert len(counted) == 6 and len(CellStore(tmp_path / "cells")) == 10
    assert list((tmp_path / "cells").glob(".*.tmp")) == []


def test_out_holding_another_commands_results_is_refused_and_kept(tiny, tmp_path, monkeypatch):
    """A suite ``--out`` pointed at a tune's folder replaced the tune's results; now refused in one line before the
    model is loaded, the folder as it was. Another preset's folder is refused too; the run's own folder resumes."""
    tune = tmp_path / "tune"
    tune.mkdir()
    (tune / "results.json").write_text(json.dumps({"meta": {"model_id": "x", "length": 2048, "budget_forwards": 4}}))
    (tune / "report.md").write_text("# the tune's report")
    before = {p.name: p.read_bytes() for p in tune.iterdir()}
    monkeypatch.setattr(grid_mod, "load_facts", lambda *a, **kw: pytest.fail("loaded the model"))
    with pytest.raises(ValueError, match=r"^--out '.*tune' holds the results of posenc tune .*give a new or empty"):
        run_suite(_preset(tiny), tune, progress=False, log=lambda m: None)
    assert {p.name: p.read_bytes() for p in tune.iterdir()} == before  # no lock, no cells, nothing replaced
    monkeypatch.undo()
    run_suite(_preset(tiny, methods=("none",)), tmp_path / "s", progress=False, log=lambda m: None)
    with pytest.raises(ValueError, match="another posenc bench .* run \\(preset 'tiny'; this one: preset 'other'\\)"):
        run_suite(_preset(tiny, name="other", methods=("none",)), tmp_path / "s", progress=False, log=lambda m: None)
    counted = _counting(monkeypatch)
    run_suite(_preset(tiny, methods=("none",)), tmp_path / "s", progress=False, log=lambda m: None)
    assert counted == []  # its own folder: resumed (nothing left to run), its report rewritten


def test_sibling_cells_folders_do_not_exclude_each_other(tiny, tmp_path, monkeypatch):
    """Runs with cells in ``sib/cellsA`` and ``sib/cellsB`` refused each other ("folder 'sib' is in use"): each locks
    its own cells folder now. Run B starts while run A computes its first cell; a run on A's cells is still refused."""
    from posenc.evals.suite import runner as cells

    real = cells.run_context
    nested = []

    def a_cell(*a, **kw):
        if not nested:
            nested.append("running")  # B's own cells come through here too
            nested.append(run_suite(_preset(tiny, methods=("none",)), tmp_path / "b", cells_dir=tmp_path / "sib" /
                                    "cellsB", progress=False, log=lambda m: None))
            with pytest.raises(FolderInUseError, match="suite cells folder '.*cellsA' is in use"):
                run_suite(_preset(tiny), tmp_path / "c", cells_dir=tmp_path / "sib" / "cellsA", progress=False,
                          log=lambda m: None)
        return real(*a, **kw)

    monkeypatch.setattr(cells, "run_context", a_cell)
    run_suite(_preset(tiny, methods=("none",)), tmp_path / "a", cells_dir=tmp_path / "sib" / "cellsA",
              progress=False, log=lambda m: None)
    assert nested[1]["meta"]["cells"] == 4 and len(CellStore(tmp_path / "sib" / "cellsB")) == 4
    assert len(CellStore(tmp_path / "sib" / "cellsA")) == 4


_READ_ONLY = """
import sys
from tests.evals.suite.test_grid import _preset
from posenc.evals.suite import run_suite
res = run_suite(_preset(sys.argv[1]), sys.argv[3], cells_dir=sys.argv[2], report_only=True, progress=False,
                log=lambda m: None)
print(res["meta"]["cells"])
"""


def test_report_only_reads_a_read_only_cells_folder(tiny, tmp_path):
    """``--report-only`` on a read-only cells folder failed creating ``.posenc.lock``: a report takes no lock on the
    cells it reads. The cells folder is mounted read-only (a user namespace: a real read-only file system even for
    root)."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no user namespaces here to mount a read-only folder (the lock is left out of report_only either "
                    "way: test_report_only_writes_nothing_into_the_cells_folder)")
    run_suite(_preset(tiny), tmp_path / "a", progress=False, log=lambda m: None)
    cells = tmp_path / "a" / "cells"
    (cells / ".posenc.lock").unlink()  # as a folder copied without it
    ro = tmp_path / "a"  # the cells folder and the folder holding it: another user's run, read-only to this one
    mount = f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro}"
    r = subprocess.run(["unshare", "-rm", "sh", "-c", f"{mount} && touch {cells}/probe 2>/dev/null && echo writable; "
                        f"{sys.executable} -c '{_READ_ONLY}' {tiny} {cells} {tmp_path / 'report'}"],
                       capture_output=True, text=True, timeout=600, cwd=str(_repo_root()))
    assert r.returncode == 0 and "writable" not in r.stdout, r.stderr[-3000:]
    assert r.stdout.split()[-1] == "10" and (tmp_path / "report" / "report.md").exists()  # SelfExtend at L: shared
    assert not (cells / ".posenc.lock").exists() and not (cells / "probe").exists()


def test_report_only_writes_nothing_into_the_cells_folder(tiny, tmp_path):
    run_suite(_preset(tiny), tmp_path / "a", progress=False, log=lambda m: None)
    cells = tmp_path / "a" / "cells"
    (cells / ".posenc.lock").unlink()
    before = sorted(p.name for p in cells.iterdir())
    res = run_suite(_preset(tiny), tmp_path / "r", cells_dir=cells, report_only=True, progress=False,
                    log=lambda m: None)
    assert res["meta"]["complete"] and sorted(p.name for p in cells.iterdir()) == before


def _repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[3]


_SIGNALLED = """
import sys, time
from pathlib import Path
from tests.evals.suite.test_grid import _preset
from posenc import cli
from posenc.evals.suite import presets, runner
presets.SUITE_PRESETS["tiny"] = _preset(sys.argv[1])
real = runner.run_context
calls = []
def slow(*a, **kw):
    calls.append(1)
    if len(calls) == 3:
        Path(sys.argv[4]).write_text("ready")  # two cells stored, the third in flight: the signal comes now
        time.sleep(600)
    return real(*a, **kw)
runner.run_context = slow
sys.exit(cli.main(["bench", "--preset", "tiny", "--out", sys.argv[2], "--cells", sys.argv[3], "--quiet"]))
"""


@pytest.mark.parametrize("sig, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_stops_the_suite_with_one_line_naming_the_cells_folder(tiny, tmp_path, monkeypatch, sig, status):
    """A real SIGINT/SIGTERM to ``posenc bench`` in the middle of a cell: one line on stderr (not stdout) naming the
    ``--cells`` folder (not OUT/cells), exit 128 + signal (SIGTERM exited 143 with no line), the finished cells whole,
    no temp file, and the resume computes only the missing ones."""
    import signal
    import subprocess
    import sys
    import time

    out, cells, ready = tmp_path / "out", tmp_path / "elsewhere" / "cells", tmp_path / "ready"
    p = subprocess.Popen([sys.executable, "-c", _SIGNALLED, str(tiny), str(out), str(cells), str(ready)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(_repo_root()))
    deadline = time.monotonic() + 600
    while not ready.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ready.exists(), p.communicate()[1][-3000:]
    p.send_signal(getattr(signal, sig))
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == status, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.startswith("posenc")]
    assert lines == [f"posenc: interrupted by {sig}: the finished cells are kept in {cells}; run the same command "
                     "to continue from them"], stderr[-3000:]
    assert "Traceback" not in stderr and "interrupted" not in stdout
    kept = CellStore(cells)
    assert len(kept) == 2 and len(list(cells.glob("*.json"))) == 2 and list(cells.glob(".*.tmp")) == []
    counted = _counting(monkeypatch)
    run_suite(_preset(tiny), out, cells_dir=cells, progress=False, log=lambda m: None)
    assert len(counted) == 8 and len(CellStore(cells)) == 10  # SelfExtend at L shares the untouched model's cells


def _trained_at(root, length):
    from posenc.hf.export import byte_tokenizer

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=260, max_position_embeddings=length)
    transformers.LlamaForCausalLM(cfg).save_pretrained(root)
    byte_tokenizer().save_pretrained(root)
    return root


def _derived(model, **kw):
    """The ``model`` preset on ``model``, with fewer cells: 4 keys in one context, 2 book passages."""
    from dataclasses import replace

    from posenc.evals.suite.presets import SUITE_PRESETS

    contexts = (ContextSpec("noise", ("keys",), seeds=1, options={"keys": {"n_keys": 4}}),
                ContextSpec("book", ("passkey",), seeds=2, target="L/16"))
    return replace(SUITE_PRESETS["model"], model=str(model), methods=("none", "selfextend"), contexts=contexts, **kw)


def test_a_model_trained_too_short_for_the_contexts_is_refused_in_one_line(tmp_path):
    model = _trained_at(tmp_path / "m64", 64)
    with pytest.raises(ValueError, match="model trained at 64 tokens: the context noise:keys does not fit its "
                                         "length 32") as err:
        run_suite(_derived(model), tmp_path / "out", progress=False, log=lambda m: None)
    assert "\n" not in str(err.value) and not (tmp_path / "out" / "results.json").exists()


def test_below_the_floor_the_run_stops_after_the_reference_cells(tmp_path):
    """A random model finds no key at its trained length: the run stops with one line after the untouched model's
    cells there, before any other row runs, and writes no results (so no effective length against 0)."""
    model = _trained_at(tmp_path / "m", L)
    ran = []
    with pytest.raises(ValueError, match=r"finds 0 of 4 keys \(0.00\) at its trained length 1024, below the floor "
                                         "0.5") as err:
        run_suite(_derived(model), tmp_path / "out", progress=False, log=ran.append, lengths=(1024, 2048))
    assert "\n" not in str(err.value) and not (tmp_path / "out" / "results.json").exists()
    assert ran and all(line.split()[1:4] == ["none", "@", "1024"] for line in ran)  # the reference cells only
    # a report of those cells judges nothing: no verdict, no effective length
    res = run_suite(_derived(model), tmp_path / "out", progress=False, log=lambda m: None, lengths=(1024, 2048),
                    report_only=True)
    assert res["reference"]["below_floor"] and res["verdicts"] == {}
    assert all(e["effective_length"] is None for e in res["effective"].values())
    assert "None: no method is judged." in (tmp_path / "out" / "report.md").read_text()


def test_the_reference_cells_run_first_even_when_a_context_is_for_some_rows_only(tmp_path):
    """A preset whose contexts name rows (more passages for the compared rows, one context for another row only)
    and which compares with a row: the untouched model's cells at the trained length still run first, those of
    the contexts it is named in (or that name no rows), and the floor then stops the run."""
    from dataclasses import replace

    model = _trained_at(tmp_path / "m", L)
    preset = _derived(model, compare_to=("selfextend",))
    preset = replace(preset, contexts=preset.contexts + (
        ContextSpec("book", ("passkey",), seeds=1, first_seed=2, target="L/16", methods=("none", "selfextend")),
        ContextSpec("book", ("passkey",), seeds=1, first_seed=3, target="L/16", methods=("selfextend",))))
    ran = []
    with pytest.raises(ValueError, match="below the floor 0.5"):
        run_suite(preset, tmp_path / "out", progress=False, log=ran.append, lengths=(1024, 2048))
    assert ran and all(line.split()[1:4] == ["none", "@", "1024"] for line in ran)
    assert len(CellStore(tmp_path / "out" / "cells")) == 4  # 1 noise + 2 book + the third context's one


def test_past_the_floor_the_run_uses_the_models_lengths_and_judges_by_the_interval_rule(tmp_path, monkeypatch):
    """The scorer patched to find every key: lengths L/2..4L of the model's L, verdicts and effective lengths by
    posenc.evals.suite.verdict, keys by distance bin, perplexity ratios over the passages, the answer-first report."""
    from posenc.evals.suite import prefill

    monkeypatch.setattr(prefill, "score", lambda text, golds: (True, 1.0))
    model = _trained_at(tmp_path / "m", L)
    res = run_suite(_derived(model), tmp_path / "out", progress=False, log=lambda m: None)
    assert sorted({r["eval_len"] for r in res["records"]}) == [512, 1024, 2048, 4096]
    ref = res["reference"]
    assert ref["length"] == L and ref["interval"]["k"] == ref["interval"]["n"] == 4 and not ref["below_floor"]
    none = res["verdicts"]["none"]
    assert none["per_length"][2048]["retrieval"] == "kept" and none["per_length"][2048]["ppl"] in ("kept", "undecided")
    assert res["effective"]["none"]["effective_length"] == none["effective_length"]
    rec = next(r for r in res["records"] if r["method"] == "selfextend" and r["eval_len"] == 4096)
    assert {b["bin"] for b in rec["by_bin"]} == {0, 1, 2} and rec["ppl_ratio"]["n"] == 2
    assert set(rec["ppl_vs"]) == {"none"} and rec["ppl_vs"]["none"]["n"] == 2
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.index("## Verdicts") < md.index("accuracy_by_length.png") < md.index("Keys found by distance back")
    assert (tmp_path / "out" / "accuracy_by_distance.png").stat().st_size > 0
