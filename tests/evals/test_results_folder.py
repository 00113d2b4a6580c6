"""posenc.evals.results_folder: which run's results a folder holds, and whether a command may write there (a resumable
run its own folder, nothing else's; eval a new or empty folder; never a file), each refusal one line naming --out."""

import json

import pytest

from posenc.evals.results_folder import check_results_folder, results_kind

TUNE = {"kind": "tune", "model": "m", "model_id": "m:llama", "length": 512, "budget_forwards": 40}
SUITE = {"kind": "suite", "preset": "smollm2", "model": "m", "model_id": "m:llama"}


def _folder(path, meta, *names):
    path.mkdir()
    (path / "results.json").write_text(json.dumps({"meta": meta, "rows": []}))
    for n in names:
        (path / n).mkdir() if "." not in n else (path / n).write_text("x")
    return path


def test_kinds_are_read_from_meta_old_results_included():
    assert results_kind(TUNE) == "tune" and results_kind(SUITE) == "suite"
    assert results_kind({"model_id": "x", "length": 1, "budget_forwards": 4}) == "tune"  # before meta["kind"]
    assert results_kind({"preset": "smollm2", "model_id": "x"}) == "suite"
    assert results_kind({"preset": "quick", "runs_dir": "r", "cells": {}}) == "lab bench"
    assert results_kind({"command": "posenc eval"}) == "eval"
    assert results_kind({"something": 1}) is None and results_kind(None) is None


def test_a_run_may_write_a_new_folder_or_its_own(tmp_path):
    check_results_folder(tmp_path / "new", "tune")
    (tmp_path / "empty").mkdir()
    check_results_folder(tmp_path / "empty", "suite")
    own = _folder(tmp_path / "t", TUNE, "cells", "model", "report.md", "rope.gguf", ".posenc.lock")
    check_results_folder(own, "tune", same={"model_id": "m:llama", "length": 512})
    interrupted = tmp_path / "i"  # cells, no results yet
    (interrupted / "cells").mkdir(parents=True)
    (interrupted / ".posenc.lock").write_text("")
    check_results_folder(interrupted, "suite")
    suite = _folder(tmp_path / "s", SUITE, "cells", "report.md", "report.html", "by_length.png",
                    "retrieval-backend.json")  # a file another tool put beside its results: left alone
    check_results_folder(suite, "suite", same={"preset": "smollm2", "model_id": "m:llama"})


def test_the_committed_result_folders_are_their_runs_own():
    """Re-running (or reporting) a committed run into its folder is not refused."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    kinds = {"suite-": "suite", "tune-": "tune", "bench-": "lab bench"}
    folders = [f for f in sorted(results.iterdir()) if (f / "results.json").exists()]
    assert len(folders) >= 5
    for f in folders:
        kind = next(k for prefix, k in kinds.items() if f.name.startswith(prefix))
        meta = json.loads((f / "results.json").read_text())["meta"]
        same = {k: meta[k] for k in ("preset", "model_id", "length") if k in meta}
        check_results_folder(f, kind, same=same)


@pytest.mark.parametrize("kind, meta, same, match", [
    ("suite", TUNE, None, "holds the results of posenc tune (model 'm', length 512), which this posenc bench "
                          "(real-model preset) would replace: give a new or empty folder (nothing was written)"),
    ("tune", SUITE, None, "holds the results of posenc bench (real-model preset) (preset 'smollm2', model 'm')"),
    ("lab bench", SUITE, None, "holds the results of posenc bench (real-model preset)"),
    ("tune", {"other": 1}, None, "holds results posenc did not write"),
    ("tune", TUNE, {"model_id": "m:llama", "length": 1024}, "holds the results of another posenc tune run (length "
                                                            "512; this one: length 1024)"),
    ("suite", SUITE, {"preset": "smollm2_full"}, "(preset 'smollm2'; this one: preset 'smollm2_full')"),
])
def test_another_runs_results_are_refused_and_left_as_they_are(tmp_path, kind, meta, same, match):
    folder = _folder(tmp_path / "out", meta, "report.md")
    before = (folder / "results.json").read_bytes()
    with pytest.raises(ValueError, match="^--out '.*out' ") as exc:
        check_results_folder(folder, kind, same=same)
    assert match in str(exc.value) and "\n" not in str(exc.value)
    assert (folder / "results.json").read_bytes() == before and sorted(p.name for p in folder.iterdir()) == [
        "report.md", "results.json"]


def test_a_file_foreign_files_or_a_broken_results_json_are_refused(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    for kind in ("tune", "suite", "lab bench", "eval"):
        with pytest.raises(ValueError, match="^--out '.*afile' exists and is not a folder$"):
            check_results_folder(afile, kind)
    assert afile.read_text() == "keep"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds files that posenc tune does not write \(config.json\)"):
        check_results_folder(model, "tune")
    broken = _folder(tmp_path / "b", TUNE)
    (broken / "results.json").write_text('{"meta": ')
    with pytest.raises(ValueError, match="holds a results.json that is not posenc's results"):
        check_results_folder(broken, "tune")
    with pytest.raises(ValueError, match="^--out .* already holds files"):
        check_results_folder(_folder(tmp_path / "e", {"command": "posenc eval"}), "eval")  # eval does not resume
    with pytest.raises(ValueError, match="kind must be one of"):
        check_results_folder(tmp_path / "x", "train")
