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
