"""posenc.runtime.parallel and ``posenc bench --jobs``: workers give the same results as one process; stops save and
stop every worker; a failing job is named."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from posenc.evals.lab import bench
from posenc.runtime.interrupt import Interrupted, StopSignals
from posenc.runtime.parallel import Job, run_jobs

TEXT = ("Shall I compare thee to a summer's day? Thou art more lovely and more temperate. "
        "Rough winds do shake the darling buds of May, and summer's lease hath all too short a date.\n")


def _square(x):
    return x * x


def _fail(x):
    raise ValueError(f"no good: {x}")


def _wait_for_stop(marker: str):
    """A job that runs until SIGTERM, then 'saves' (writes ``marker``) and stops like a training does."""
    with StopSignals() as stop:
        Path(marker + ".started").write_text("")
        for _ in range(2000):  # 100 s at most
            time.sleep(0.05)
            if stop.requested:
                Path(marker).write_text("saved")
                stop.check("saved the marker")
    raise AssertionError("never stopped")


class _StopWhen(StopSignals):
    """The parent's stop, requested once ``n`` files exist (as if SIGTERM arrived when the jobs were running)."""

    def __init__(self, files: list[Path], n: int):
        super().__init__()
        self.files, self.n = files, n

    @property
    def requested(self) -> bool:
        if self.signum is None and sum(f.exists() for f in self.files) >= self.n:
            self.signum = 15
        return self.signum is not None


def test_results_come_back_in_order_with_their_times():
    jobs = [Job(f"square {i}", _square, (i,)) for i in range(5)]
    results, seconds = run_jobs(jobs, 2, stop=StopSignals(), log=lambda m: None)
    assert results == [0, 1, 4, 9, 16] and set(seconds) == {j.label for j in jobs}


def test_a_failing_job_is_named_and_nothing_is_left_running(capfd):
    jobs = [Job("fine", _square, (3,)), Job("broken one", _fail, (7,))]
    with pytest.raises(RuntimeError, match=r"broken one failed in its worker .*ValueError: no good: 7"):
        run_jobs(jobs, 2, stop=StopSignals(), log=lambda m: None)
    import multiprocessing

    assert multiprocessing.active_children() == []


def test_a_stop_reaches_every_worker_which_saves_then_the_parent_raises(tmp_path):
    markers = [tmp_path / f"m{i}" for i in range(3)]
    jobs = [Job(f"long {i}", _wait_for_stop, (str(m),)) for i, m in enumerate(markers)]
    t = time.perf_counter()
    with pytest.raises(Interrupted, match=r"0 of 3 job\(s\) finished") as exc:
        run_jobs(jobs, 2, stop=_StopWhen([Path(f"{m}.started") for m in markers], 2), log=lambda m: None)
    assert exc.value.exit_status == 143
    assert [m.exists() for m in markers] == [True, True, False]  # the third never started
    assert time.perf_counter() - t < 60


def test_bad_worker_counts_are_refused():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        run_jobs([], 0, stop=StopSignals())
    with pytest.raises(ValueError, match="jobs"):
        bench.BenchPreset("bad", "", jobs=0)


def test_a_parallel_bench_equals_the_sequential_one(tmp_path, monkeypatch):
    """The same preset at jobs=1 and jobs=2: the same checkpoints byte for byte, the same records and retrieval
    rows; the cells a worker computed count as computed; jobs is not part of a cell's key."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 60)
    preset = bench.BenchPreset("tinyp", "", corpus=str(corpus), dim=16, n_layers=1, n_heads=2, train_len=16,
                               steps=3, batch_size=2, warmup=1, val_batches=1, eval_factors=(1, 2),
                               schemes=("rope",), rope_methods=("pi",), learned_methods=(), max_windows=3,
                               eval_batch_size=2, recall_batch=2, recall_pairs=1, recall_trials=4, recall_task="kv",
                               seeds=2, seed_schemes=("rope",), eval_mode="tail")
    one = bench.run_bench(preset, tmp_path / "one", progress=False)
    two = bench.run_bench(replace(preset, jobs=2), tmp_path / "two", progress=False)
    for run in ("rope", "rope-seed1"):
        a, b = (tmp_path / d / "runs" / run / "model.safetensors" for d in ("one", "two"))
        assert a.read_bytes() == b.read_bytes(), run

    def rows(results, key):
        return sorted(json.dumps({k: v for k, v in r.items() if k not in ("seconds", "tokens_per_s")},
                                 sort_keys=True) for r in results[key])

    assert rows(one, "records") == rows(two, "records") and rows(one, "retrieval") == rows(two, "retrieval")
    assert two["meta"]["cells"] == one["meta"]["cells"] == {"reused": 0, "computed": one["meta"]["cells"]["computed"]}
    assert two["meta"]["config"]["jobs"] == 2 and "train (wall, parallel)" in two["meta"]["timings"]
    again = bench.run_bench(preset, tmp_path / "two", progress=False)  # jobs=1 reads the workers' cells back
    assert again["meta"]["cells"]["computed"] == 0
