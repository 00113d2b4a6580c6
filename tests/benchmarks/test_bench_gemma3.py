"""benchmarks/bench_gemma3_speed.py: the table it renders is the committed one on docs/results/gemma3.md, read from
its JSON; bad flags are refused in one line."""

import json
from pathlib import Path

import pytest

from benchmarks import bench_gemma3_speed as bench

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "bench_gemma3_speed.json"


def test_the_results_page_shows_the_committed_table():
    page = (ROOT / "docs" / "results" / "gemma3.md").read_text(encoding="utf-8")
    block = page[page.index("<!-- gemma3-speed:begin -->") + len("<!-- gemma3-speed:begin -->"):
                 page.index("<!-- gemma3-speed:end -->")].strip()
    assert block == bench.table(json.loads(RESULT.read_text(encoding="utf-8")))


def test_the_committed_run_alternates_the_paths_at_both_lengths_on_an_idle_machine():
    res = json.loads(RESULT.read_text(encoding="utf-8"))
    cells = res["cells"]
    assert {(c["length"], c["path"]) for c in cells} == {(n, p) for n in (16384, 32768) for p in bench.PATHS}
    firsts = [c["path"] for c in cells if c["length"] == 16384][::2]
    assert firsts == ["transformers", "posenc"]  # the order flipped per repeat
    assert max(c["load_after"] for c in cells) < 2.5  # the benchmark's own 2 threads, nothing else
    for s in res["summary"].values():
        assert s["speedup"] == pytest.approx(s["transformers_s"] / s["posenc_s"])


def test_the_table_prints_seconds_speedup_and_memory():
    res = {"summary": {"2048": {"transformers_s": 4.26, "posenc_s": 3.31, "speedup": 1.287,
                                "transformers_extra_mb": 13.2, "posenc_extra_mb": 0.4}}}
    assert bench.table(res).splitlines()[-1] == "| 2k | 4.3 | 3.3 | 1.29x | 13 / 0 |"


@pytest.mark.parametrize("argv,msg", [(["--lengths", "16k"], "--lengths takes comma-separated integers"),
                                      (["--repeats", "2"], "--repeats needs one count per length"),
                                      (["--lengths", "0"], "--lengths takes positive integers")])
def test_bad_flags_are_refused_in_one_line(argv, msg):
    with pytest.raises(SystemExit, match=msg):
        bench.main(argv)
