"""posenc.evals.suite.cluster: the suite's cells dispatched over a Ray cluster, on a local cluster of 2 CPU
workers and the tiny random Llama of tests/evals/suite/test_grid.py: the results equal the sequential run's, a cell
already in the folder is not recomputed, a worker killed in the middle of a cell has that cell recomputed exactly
once; and, without Ray, the dispatch order, the per-worker model and the refusals."""

import json
import sys
from types import SimpleNamespace

import pytest

from posenc.evals.suite import ContextSpec, SuitePreset, run_suite
from posenc.evals.suite import cluster as cluster_mod
from posenc.evals.suite.results import MACHINE_FIELDS
from posenc.runtime.cells import CellStore, cell_digest

TIMING = MACHINE_FIELDS  # per record: what the machine and the moment set

META_TIMING = ("machine", "cell_seconds_total", "this_sitting_seconds")


def _preset(model) -> SuitePreset:
    """12 cells; the reference length is the pruned length, so the untouched model's cells there must be finished
    before the other rows' pruning is decided (a wrong dispatch order leaves rows out: "not finished")."""
    contexts = (ContextSpec("book", ("niah",), seeds=1, target=32), ContextSpec("noise", ("passkey",), seeds=1))
    return SuitePreset(name="tiny", description="test", model=str(model), lengths=(1024, 2048),
                       methods=("none", "selfextend", "rerope+logn"), contexts=contexts, reference_length=2048,
                       prune_from=2048)


def _comparable(out) -> dict:
    """``out/results.json`` without its timing and machine fields."""
    res = json.loads((out / "results.json").read_text())
    res["meta"] = {k: v for k, v in res["meta"].items() if k not in META_TIMING}
    res["records"] = [{k: v for k, v in r.items() if k not in TIMING} for r in res["records"]]
    return res


def _key(model, method: str, length: int, context: int) -> dict:
    from posenc.evals.suite.spec import cell_key, load_facts, method_params

    preset, m = _preset(model), load_facts(str(model))
    params = method_params(method, m.train_len, length, m.head_dim, m.base, preset.params)
    return cell_key(m.model_id, method, params, length, preset.contexts[context], 0, preset.chat)


def test_lengths_are_dispatched_in_order_the_reference_rows_first_where_pruning_reads_them(tmp_path):
    preset = _preset(tmp_path)
    assert cluster_mod.waves(preset, 1024) == [("none", "selfextend", "rerope+logn")]  # before prune_from
    assert cluster_mod.waves(preset, 2048) == [("none",), ("selfextend", "rerope+logn")]
    from dataclasses import replace

    assert cluster_mod.waves(replace(preset, reference_length=1024), 2048) == [preset.methods]  # reference finished


def test_a_worker_keeps_the_model_of_its_last_group(monkeypatch):
    """Consecutive cells of one (method, parameters, length) on a worker load the model once; another group loads
    its own (one model per worker); another model clears the tokenized haystacks."""
    from posenc.evals.suite import runner as cells

    monkeypatch.setattr(cluster_mod, "_WORKER", {})
    loads = []
    m = SimpleNamespace(model_id="a", device="cpu", dtype="float32",
                        fresh=lambda method, params: loads.append((method, params)) or object())
    first, loaded = cluster_mod._model_for(m, "yarn", {"factor": 2.0}, 2048)
    assert loaded and cluster_mod._model_for(m, "yarn", {"factor": 2.0}, 2048) == (first, False)
    assert cluster_mod._model_for(m, "yarn", {"factor": 4.0}, 4096)[1]
    assert cluster_mod._model_for(m, "yarn", {"factor": 2.0}, 2048)[1]  # only the last group is kept
    assert len(loads) == 3
    monkeypatch.setitem(cells._HAYSTACKS, "book", "tokens of model a")
    cluster_mod._model_for(SimpleNamespace(**{**vars(m), "model_id": "b"}), "yarn", {"factor": 2.0}, 2048)
    assert "book" not in cells._HAYSTACKS


def test_refusals_name_the_flag(tmp_path, capsys, monkeypatch):
    from posenc.cli import main

    out = str(tmp_path / "o")
    assert main(["bench", "--preset", "quick", "--out", out, "--ray"]) == 2
    err = capsys.readouterr().err
    assert "--ray is for the real-model presets (gemma3, model, smollm2" in err and "--jobs" in err
    assert len(err.splitlines()) == 1
    assert main(["bench", "--preset", "smollm2", "--out", out, "--ray", "--report-only"]) == 2
    assert "--ray runs cells and --report-only runs none" in capsys.readouterr().err
    assert main(["bench", "--preset", "smollm2", "--out", out, "--ray", " "]) == 2
    assert "--ray ADDRESS: the address is empty" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    assert main(["bench", "--preset", "smollm2", "--out", out, "--ray", "auto"]) == 2
    err = capsys.readouterr().err
    assert err == "posenc: error: --ray needs Ray, which is not installed: pip install 'posenc[ray]'\n"
    with pytest.raises(ModuleNotFoundError, match=r"dispatch='ray' needs Ray.*pip install 'posenc\[ray\]'"):
        run_suite(_preset(tmp_path), out, dispatch="ray")
    with pytest.raises(ValueError, match="dispatch must be None .* or 'ray', got 'dask'"):
        run_suite(_preset(tmp_path), out, dispatch="dask")
    with pytest.raises(ValueError, match="dispatch='ray' runs cells and report_only runs none"):
        run_suite(_preset(tmp_path), out, dispatch="ray", report_only=True)
    assert not (tmp_path / "o").exists()


# --- on a local Ray cluster of 2 CPU workers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    import transformers

    from posenc.hf.export import byte_tokenizer

    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=260, max_position_embeddings=1024)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def sequential(tiny, tmp_path_factory):
    """The run without Ray: the reference."""
    out = tmp_path_factory.mktemp("sequential")
    run_suite(_preset(tiny), out, progress=False, log=lambda m: None)
    return out


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray cluster of 2 CPU workers, its workers armed with the crash hook's folder (empty: no cell armed)."""
    ray = pytest.importorskip("ray")
    hook = tmp_path_factory.mktemp("crash_hook")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cluster_mod.CRASH_ONCE_ENV, str(hook))  # the workers inherit it
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error")
        try:
            yield hook
        finally:
            ray.shutdown()


@pytest.mark.slow
def test_a_ray_run_equals_the_sequential_one_and_reads_the_cells_already_finished(tiny, sequential, ray_cluster,
                                                                                  tmp_path):
    """ReRoPE's 4 cells are in the folder before the run: the Ray run computes the other 6 (those 4 files are not
    rewritten; SelfExtend at L = 1024 is the identity and shares the untouched model's 2 cells, computed once), and
    its results.json equals the sequential run's but for timing and machine fields (records, retrieval by depth,
    effective lengths, left-out pairs: SelfExtend runs at 2048 only because the untouched model's cells there were
    finished before its pruning was decided)."""
    kept = CellStore(tmp_path / "cells")
    for key, value in CellStore(sequential / "cells").items():
        if key["method"] == "rerope+logn":
            kept.put(key, value)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in kept.folder.iterdir()}
    assert len(before) == 4
    lines = []
    res = run_suite(_preset(tiny), tmp_path, progress=False, log=lines.append, dispatch="ray")
    ray_meta = res["meta"]["machine"]["ray"]
    assert ray_meta["computed"] == 6 and ray_meta["task"] == {"num_cpus": 1} and ray_meta["cpus"] == 2
    assert len(lines) == 6 and not any(line.startswith("rerope+logn @") for line in lines)
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in kept.folder.iterdir() if p.name in before} \
        == before
    assert len(kept) == 10 and res["meta"]["cells"] == 10 and res["meta"]["left_out"] == {}
    assert _comparable(tmp_path) == _comparable(sequential)


@pytest.mark.slow
def test_a_killed_workers_cell_is_recomputed_once(tiny, sequential, ray_cluster, tmp_path, monkeypatch, capsys):
    """``posenc bench --ray``: the worker running SelfExtend's book cell at 2048 dies once the cell is computed,
    before it is stored (``os._exit``): Ray runs the task again on another worker, the cell is computed exactly twice
    (one attempt per worker), stored once, and the results equal the sequential run's."""
    from posenc.cli import main
    from posenc.evals.suite.presets import SUITE_PRESETS

    monkeypatch.setitem(SUITE_PRESETS, "tiny_cluster", _preset(tiny))
    digest = cell_digest(_key(tiny, "selfextend", 2048, 0))
    (ray_cluster / f"{digest}.crash").touch()
    try:
        assert main(["bench", "--preset", "tiny_cluster", "--out", str(tmp_path), "--ray", "--quiet"]) == 0
    finally:
        (ray_cluster / f"{digest}.crash").unlink()
    assert f"report: {tmp_path}/report.md (10 cells)" in capsys.readouterr().out  # SelfExtend at L: shared
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["left_out"] == {}
    attempts = sorted(p.name.rsplit("-", 1)[1] for p in ray_cluster.glob(f"{digest}.attempt-*"))
    assert len(attempts) == 2 and attempts[0] != attempts[1]  # killed once, recomputed once, by another process
    assert res["meta"]["machine"]["ray"]["computed"] == 10
    assert sorted(p.name for p in (tmp_path / "cells").iterdir()).count(f"{digest}.json") == 1
    files = [p.name for p in (tmp_path / "cells").iterdir() if p.name != ".posenc.lock"]  # the run locks its cells
    assert len(files) == 10  # one file per cell, no temp file left
    assert _comparable(tmp_path) == _comparable(sequential)


@pytest.mark.slow
def test_below_the_floor_a_ray_run_stops_after_the_reference_cells(tiny, ray_cluster, tmp_path):
    """As without Ray: the random model finds no key at its trained length, so the cluster runs the untouched
    model's cells there, the run stops with the floor's one line, and no other row runs and nothing is judged."""
    from dataclasses import replace

    from posenc.evals.suite.presets import SUITE_PRESETS

    contexts = (ContextSpec("noise", ("keys",), seeds=1, options={"keys": {"n_keys": 4}}),)
    preset = replace(SUITE_PRESETS["model"], model=str(tiny), methods=("none", "selfextend"), contexts=contexts)
    with pytest.raises(ValueError, match=r"finds 0 of 4 keys \(0.00\) at its trained length 1024, below the floor "
                                         "0.5") as err:
        run_suite(preset, tmp_path / "out", cells_dir=tmp_path / "cells", progress=False, log=lambda m: None,
                  lengths=(1024, 2048), dispatch="ray")
    assert "\n" not in str(err.value) and not (tmp_path / "out" / "results.json").exists()
    keys = [k for k, _ in CellStore(tmp_path / "cells").items()]
    assert keys and all(k["method"] == "none" and k["length"] == 1024 for k in keys)
