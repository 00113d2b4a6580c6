"""The committed startup benchmark (benchmarks/results/bench_startup.json, written by ``python -m
benchmarks.bench_startup``): ``posenc --version`` and ``--help`` under 0.5 s and every subcommand's ``--help`` under
1 s on the median of fresh processes, every subcommand measured; and the benchmark itself runs (two repeats)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.bench_startup import LIMITS_S, commands, limit_of

RESULT = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "bench_startup.json"


def test_the_committed_startup_times_are_within_the_limits():
    data = json.loads(RESULT.read_text())
    assert data["limits_s"] == LIMITS_S == {"top": 0.5, "subcommand_help": 1.0}
    rows = data["rows"]
    assert set(rows) == set(commands()), "a subcommand was added or removed: rerun python -m benchmarks.bench_startup"
    slow = {name: r["median_s"] for name, r in rows.items()
            if limit_of(name) is not None and not r["median_s"] < limit_of(name)}
    assert not slow, slow
    for r in rows.values():  # the medians are of the samples shown, several fresh processes each
        assert len(r["samples_s"]) >= 5 and statistics.median(r["samples_s"]) == r["median_s"]
    assert data["summary"]["all_within_limits"] is True


def test_the_limits_are_the_goals():
    assert limit_of("posenc --version") == limit_of("posenc --help") == 0.5
    assert limit_of("posenc extend --help") == 1.0 and limit_of("import posenc") is None


@pytest.mark.slow
def test_the_benchmark_runs(tmp_path):
    from benchmarks.bench_startup import run
    from benchmarks.common import write_json

    data = json.loads(write_json("bench_startup", run(quick=True), tmp_path).read_text())
    assert set(data["rows"]) == set(commands()) and all(len(r["samples_s"]) == 2 for r in data["rows"].values())
