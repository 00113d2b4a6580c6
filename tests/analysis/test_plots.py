"""posenc.analysis.plots: every picture is written as a PNG, and a bad output path creates no folder."""

from __future__ import annotations

import pytest

from posenc.analysis.plots import plot_decay, plot_frequencies, plot_rotations

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------- plots + CLI
def _is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == PNG_MAGIC


def test_plots_write_png(tmp_path):
    assert _is_png(plot_decay(tmp_path / "decay.png", head_dim=32, max_distance=200))
    (tmp_path / "sub").mkdir()
    assert _is_png(plot_rotations(tmp_path / "sub" / "rot.png", head_dim=64, train_len=2048))
    assert _is_png(plot_frequencies(tmp_path / "freq.png", head_dim=64, train_len=1024, factor=4))
    with pytest.raises(ValueError, match="png"):
        plot_decay(tmp_path / "decay.jpg")


def test_plot_does_not_create_folders(tmp_path):
    from posenc.analysis.plots import plot_decay

    with pytest.raises(ValueError, match=r"out folder .* does not exist; create it first"):
        plot_decay(tmp_path / "a" / "b" / "x.png", head_dim=8, max_distance=10)
    assert not (tmp_path / "a").exists()


def test_plot_map_writes_png(tmp_path):
    from posenc.analysis.plots import plot_map

    assert _is_png(plot_map(tmp_path / "map.png", "streaming_llm", 16, 48, {"window": 8}, dpi=50))
    assert _is_png(plot_map(tmp_path / "fire.png", "fire", 16, 32, dpi=50))  # no rotary part: the third panel says so
