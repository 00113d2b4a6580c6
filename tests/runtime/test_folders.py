"""posenc.runtime.folders: a folder written as a whole, or not at all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from posenc.runtime.folders import remove_stale_staging, staged_folder


def _write(folder, text="new"):
    (folder / "config.json").write_text(text)
    (folder / "model.safetensors").write_text(text * 10)


def test_the_target_appears_whole_and_no_staging_is_left(tmp_path):
    target = tmp_path / "out"
    with staged_folder(target) as stage:
        _write(stage)
        assert not target.exists()  # nothing at the target until the block ends
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_failure_leaves_the_target_as_it_was_and_removes_the_staging(tmp_path):
    target = tmp_path / "out"
    target.mkdir()  # an empty folder may be the target
    with pytest.raises(OSError, match="disk full"), staged_folder(target) as stage:
        (stage / "config.json").write_text("half")
        raise OSError(28, "disk full")
    assert list(target.iterdir()) == [] and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_folder_holding_files_is_refused_untouched(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    _write(target, "old")
    with pytest.raises(ValueError, match=r"'.*out' already holds files \(config.json, model.safetensors\)"):
        with staged_folder(target, what="--out") as stage:
            _write(stage)
    assert (target / "config.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_replace_swaps_the_old_content_for_the_new_whole(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    _write(target, "old")
    (target / "stale.py").write_text("x")  # a file of the old content only: gone with it
    with staged_folder(target, replace=True) as stage:
        _write(stage, "new")
    assert (target / "config.json").read_text() == "new" and not (target / "stale.py").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_killed_writer_leaves_the_target_absent_and_the_next_write_cleans_up(tmp_path):
    """A real SIGKILL in the middle of writing: the target does not exist (no config without weights), only the
    dead process's staging folder, which the next write of the target removes."""
    target = tmp_path / "out"
    code = textwrap.dedent(f"""
        import os, signal, time
        from posenc.runtime.folders import staged_folder
        with staged_folder({str(target)!r}) as stage:
            (stage / "config.json").write_text("half")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL
    assert not target.exists()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".out.staging-")
    with staged_folder(target) as stage:
        _write(stage)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_live_writers_staging_is_kept(tmp_path):
    target = tmp_path / "out"
    mine = tmp_path / f".out.staging-{os.getpid()}"
    mine.mkdir()
    dead = tmp_path / ".out.staging-999999999"
    dead.mkdir()
    assert remove_stale_staging(target) == [dead] and mine.is_dir()
