"""``posenc perf``: the benchmark suite at tiny sizes writes its Markdown."""

from __future__ import annotations

import json


# ---------------------------------------------------------------------------------------------- benchmarks
def _check_json(path, name):
    data = json.loads(path.read_text())
    assert data["benchmark"] == name
    assert {"cpu", "cores", "torch"} <= set(data["machine"])
    assert isinstance(data["summary"], dict) and data["summary"]
    return data


def test_perf_cli_writes_markdown(tmp_path):
    from posenc.cli import main

    assert main(["perf", "--quick", "--only", "bench_rope", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "perf.md").read_text()
    assert "| metric | value |" in md and "torch" in md
    assert md.count("Machine: ") == 1  # each section names its own JSON's machine; only bench_rope's exists here
    _check_json(tmp_path / "bench_rope.json", "bench_rope")


def test_perf_writes_into_a_git_ignored_folder_by_default(tmp_path, monkeypatch):
    """In a clone, ``posenc perf`` with no --out must not overwrite the committed benchmarks/results: its default is
    runs/perf, which git ignores."""
    import subprocess
    from pathlib import Path

    from posenc.cli import main, perf

    root = Path(__file__).resolve().parents[2]
    run_all = perf._import_run_all()
    seen = {}

    def record(quick, out, only):
        seen.update(out=out, only=only)
        return {}

    monkeypatch.setattr(run_all, "run_all", record)
    assert main(["perf", "--quick", "bench_rope"]) == 0
    assert seen == {"out": "runs/perf", "only": ["bench_rope"]}
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/perf/bench_rope.json"], cwd=root)
    assert ignored.returncode == 0  # 0: ignored
    assert subprocess.run(["git", "check-ignore", "-q", "benchmarks/results/bench_rope.json"], cwd=root).returncode == 1
