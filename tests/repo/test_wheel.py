"""A wheel built from the tree, installed in a fresh venv, then ``posenc data``: the bench corpus has the digest of
a clone's (``make venv``) corpus. Slow tier: it builds a wheel and installs torch and posenc into a new venv
(pip needs the same package index ``make venv`` uses)."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from posenc.data.corpora import GUTENBERG, corpus_digest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(*cmd, cwd) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


def test_wheel_install_with_posenc_data_gets_the_clones_corpus(tmp_path):
    clone = corpus_digest("gutenberg")  # this environment is a clone's (make venv)
    assert clone["sha256"] == GUTENBERG["sha256"]
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist",
         ROOT, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("posenc-*.whl"))
    venv.create(tmp_path / "env", with_pip=True)
    py = tmp_path / "env" / "bin" / "python"
    import torch

    _run(py, "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}", cwd=tmp_path)
    _run(py, "-m", "pip", "install", "-q", wheel, cwd=tmp_path)
    posenc = tmp_path / "env" / "bin" / "posenc"
    before = subprocess.run([posenc, "data", "--check"], cwd=tmp_path, capture_output=True, text=True)
    assert before.returncode == 2 and "run `posenc data`" in before.stderr, before.stderr  # nothing installed yet
    _run(posenc, "data", "--quiet", cwd=tmp_path)
    after = json.loads(_run(posenc, "data", "--check", "--json", cwd=tmp_path).stdout)
    assert (after["documents"], after["bytes"], after["sha256"]) == (clone["documents"], clone["bytes"],
                                                                      clone["sha256"])
