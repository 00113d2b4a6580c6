"""Benchmarks (benchmarks/) run at tiny sizes and write well-formed JSON.

No timing asserts: timings are only reported by ``benchmarks/`` (see ``make perf``)."""

from __future__ import annotations

import json
import os

import pytest


# ---------------------------------------------------------------------------------------------- benchmarks
def _check_json(path, name):
    data = json.loads(path.read_text())
    assert data["benchmark"] == name
    assert {"cpu", "cores", "torch"} <= set(data["machine"])
    assert isinstance(data["summary"], dict) and data["summary"]
    return data


@pytest.mark.parametrize("name", ["bench_rope", "bench_training", "bench_attention", "bench_compile",
                                  "bench_generation", "bench_jobs", "bench_retrieval"])
def test_benchmark_quick_smoke(name, tmp_path):
    import importlib

    from benchmarks.common import write_json

    mod = importlib.import_module(f"benchmarks.{name}")
    res = mod.run(quick=True)
    data = _check_json(write_json(name, res, tmp_path), name)
    if name == "bench_rope":
        assert data["summary"]["shape"] == [1, 4, 256, 64]
    if name == "bench_attention":
        assert data["summary"]["rerope_bojone_vs_posenc_maxdiff"] < 1e-4  # the two ReRoPEs agree
        assert all("extra_mb" in m for m in data["memory"]), data["memory"]
        assert set(data["summary"]["goals"]) >= {"alibi<=1.5x_sdpa", "rerope<=2x_sdpa"}
    if name == "bench_retrieval":  # the two posenc paths compute the same attention
        assert data["summary"]["N=1024"]["max_abs_diff"] < 1e-5
    if name == "bench_jobs":  # the three peers, each against one job on one thread
        assert set(data["rows"]) == {"1 job x 1 thread", f"1 job x {os.cpu_count()} threads",
                                     f"{os.cpu_count()} jobs x 1 thread"}
        assert data["rows"]["1 job x 1 thread"]["speedup"] == 1.0
    if name == "bench_generation":  # the cache stays the same size however long the stream
        assert data["summary"]["streaming_cache_kib"][0] == data["summary"]["streaming_cache_kib"][1]
