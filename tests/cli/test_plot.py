"""``posenc plot``: every picture from the command line, and no folder created for a bad output path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.cli import assert_one_line_error, run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------- plots + CLI
def _is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == PNG_MAGIC


def test_plot_cli(tmp_path, capsys):
    from posenc.cli import main

    path = tmp_path / "decay.png"
    assert main(["plot", "decay", "--out", str(path), "--max-distance", "100"]) == 0
    assert _is_png(path) and capsys.readouterr().out.strip() == str(path)
    path = tmp_path / "rot.png"
    assert main(["plot", "rotations", "--out", str(path), "--head-dim", "64", "--base", "500000",
                 "--train-len", "8192"]) == 0
    assert _is_png(path)
    assert main(["plot", "frequencies", "--out", str(tmp_path / "f.png"), "--head-dim", "32"]) == 0
    assert main(["plot", "decay", "--out", str(tmp_path / "bad.png"), "--base", "0"]) == 2
    assert "base" in capsys.readouterr().err
    assert main(["plot", "nope", "--out", str(tmp_path / "x.png")]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err

ROOT = Path(__file__).resolve().parents[2]




def test_plot_does_not_create_missing_folders(tmp_path, capsys):
    rc, err = run_cli(["plot", "decay", "--out", tmp_path / "a" / "b" / "x.png"], capsys)
    assert_one_line_error(rc, err, "does not exist; create it first")
    assert not (tmp_path / "a").exists()


# ------------------------------------------------------------------------------------------------ real processes
def _posenc(*argv, debug=False, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k != "POSENC_DEBUG"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if debug:
        env["POSENC_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "posenc", *map(str, argv)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_real_plot_command_creates_no_folder(tmp_path):
    res = _posenc("plot", "decay", "--out", tmp_path / "x" / "y" / "d.png", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert not (tmp_path / "x").exists()
