"""benchmarks/figures.py: the committed figures of the timing and coverage results are what their JSON draws now."""

from __future__ import annotations

import shutil

from benchmarks import figures


def test_committed_figures_are_current():
    assert figures.stale() == [], "stale figures: run python -m benchmarks.figures"


def test_check_names_a_stale_figure(tmp_path, monkeypatch, capsys):
    for name in ("bench_attention.json", "bench_real_model.json", "hf_compat.json", "bench_gemma3_speed.json",
                 "near_key_attention.json"):
        shutil.copy(figures.RESULTS / name, tmp_path / name)
    monkeypatch.setattr(figures, "RESULTS", tmp_path)
    assert figures.main(["--check"]) == 1  # none drawn yet
    assert figures.main([]) == 0 and figures.main(["--check"]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(figures.FIGURES)
    (tmp_path / "hf_compat.png").write_bytes(b"old")
    assert figures.main(["--check"]) == 1
    assert "stale: benchmarks/results/hf_compat.png" in capsys.readouterr().err
