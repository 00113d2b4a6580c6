"""A folder written as a whole: :func:`staged_folder` gives a hidden staging folder beside the target
(``.NAME.staging-PID``) to write into, and moves it into place only when the writing finished. A reader never
sees a half-written target; a failure (a full disk, an exception) removes the staging folder and leaves the target
as it was; a process killed while writing leaves only its staging folder, which the next write of the same target
removes (:func:`remove_stale_staging`: its process is gone).

A target that holds files is refused (``ValueError`` naming it and what is in it), unless ``replace=True``: the
old content is then moved aside (``.NAME.old-PID``), the new one moved in, and the old one removed, so at every
moment the target is the old folder or the new one whole."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

__all__ = ["check_target", "remove_stale_staging", "staged_folder"]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staging(target) -> list[Path]:
    """Remove the staging and set-aside folders of ``target`` (``.NAME.staging-PID``, ``.NAME.old-PID``) whose
    process is gone; returns them."""
    target = Path(target)
    removed = []
    if not target.parent.is_dir():
        return removed
    for p in target.parent.glob(f".{target.name}.*-*"):
        kind, _, pid = p.name[len(target.name) + 2:].rpartition("-")
        if kind in ("staging", "old") and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _contents(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def check_target(target, *, what: str = "folder", replace: bool = False) -> None:
    """``ValueError`` when ``target`` is a file, or a folder holding files (unless ``replace``): what
    :func:`staged_folder` refuses, checked before the work that would fill it (a command checks its ``--out``
    before it loads a model)."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{what} {str(target)!r} exists and is not a folder")
    held = _contents(target)
    if held and not replace:
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise ValueError(f"{what} {str(target)!r} already holds files ({shown}): give a new or empty folder; "
                         "nothing was written")


@contextlib.contextmanager
def staged_folder(target, *, replace: bool = False, what: str = "folder"):
    """Yield a staging folder to write ``target``'s content into; move it into place when the block ends without
    an exception (see the module docstring). ``what`` names the target in messages ("--out", "the model folder")."""
    target = Path(target)
    check_target(target, what=what, replace=replace)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(target)
    staging = target.parent / f".{target.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        _move_in(staging, target, replace)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _move_in(staging: Path, target: Path, replace: bool) -> None:
    """``staging`` becomes ``target`` (an empty target is replaced by the rename itself; a full one, with
    ``replace``, is moved aside first and removed after)."""
    old = None
    if target.is_dir() and any(target.iterdir()):
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
    try:
        os.rename(staging, target)  # rename(2) replaces an empty directory
    except BaseException:
        if old is not None:
            os.rename(old, target)  # put the old content back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    with contextlib.suppress(OSError):
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
