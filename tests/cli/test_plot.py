"""``posenc plot``: every picture from the command line, and no folder created for a bad output path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from posenc.cli import main as cli_main
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




def test_plot_creates_missing_parents_as_every_out_does(tmp_path, capsys):
    """``plot --out a/b`` creates a and b, as ``extend --out a/b`` does (one convention for --out); a file in the way
    is one line naming --out, and nothing is created."""
    assert cli_main(["plot", "decay", "--out", str(tmp_path / "a" / "b"), "--max-distance", "50"]) == 0
    assert _is_png(tmp_path / "a" / "b" / "decay.png")
    assert cli_main(["plot", "decay", "--out", str(tmp_path / "c" / "d" / "x.png"), "--max-distance", "50"]) == 0
    assert _is_png(tmp_path / "c" / "d" / "x.png")  # the old --out FILE.png spelling too
    capsys.readouterr()
    (tmp_path / "file").write_text("keep")
    rc, err = run_cli(["plot", "decay", "--out", tmp_path / "file" / "e"], capsys)
    assert_one_line_error(rc, err, f"--out {tmp_path / 'file' / 'e'}")
    assert (tmp_path / "file").read_text() == "keep"


# ------------------------------------------------------------------------------------------------ real processes
def _posenc(*argv, debug=False, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k != "POSENC_DEBUG"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if debug:
        env["POSENC_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "posenc", *map(str, argv)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_real_plot_command_creates_the_missing_parents(tmp_path):
    res = _posenc("plot", "decay", "--out", tmp_path / "x" / "y", "--max-distance", "50", cwd=tmp_path)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert _is_png(tmp_path / "x" / "y" / "decay.png")


def test_plot_map(tmp_path, capsys):
    """``posenc plot map``: the method's map as DIR/map-METHOD.png with its parameters; every flag checked in one
    line, and the map-only flags refused on the other pictures."""
    from posenc.cli import main

    assert main(["plot", "map", "--method", "selfextend", "--param", "group=4", "--window", "8", "--length", "64",
                 "--out", str(tmp_path)]) == 0
    assert _is_png(tmp_path / "map-selfextend.png")
    assert capsys.readouterr().out.strip() == str(tmp_path / "map-selfextend.png")
    assert main(["plot", "map", "--method", "alibi", "--length", "32", "--out", str(tmp_path)]) == 0  # trained-in
    assert _is_png(tmp_path / "map-alibi.png")
    for argv, message in ((["--method", "yran", "--length", "64"], "did you mean 'yarn'"),
                          (["--method", "yarn"], "plot map needs --method NAME and --length N"),
                          (["--method", "yarn", "--length", "9999"], "--length must be at most 2048"),
                          (["--method", "yarn", "--length", "1"], "--length"),
                          (["--method", "yarn", "--param", "bogus=1", "--length", "64"], "bogus")):
        rc, err = run_cli(["plot", "map", *argv, "--out", tmp_path / "bad"], capsys)
        assert_one_line_error(rc, err, message)
    rc, err = run_cli(["plot", "decay", "--method", "yarn", "--out", tmp_path / "bad"], capsys)
    assert_one_line_error(rc, err, "--method is a flag of plot map only")
    assert not (tmp_path / "bad").exists()


def test_plot_out_that_is_a_file_is_one_line_naming_out(tmp_path, capsys):
    """``plot decay --out afile`` gave ``[Errno 17] File exists``: one line naming --out, the file kept, no picture."""
    afile = tmp_path / "afile"
    afile.write_text("keep")
    rc, err = run_cli(["plot", "decay", "--out", afile, "--max-distance", "50"], capsys)
    assert_one_line_error(rc, err, f"--out {str(afile)!r} exists and is not a folder")
    assert afile.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
