"""Atomic file writes: a reader sees the old file or the complete new one, never a partial one.

Every file posenc writes for a user (checkpoints, results, reports, PNGs, caches) goes through
:func:`atomic_write_bytes`: the data is written to a temp file ``.NAME.*.tmp`` in the destination folder,
flushed and fsynced, then moved over ``NAME`` with ``os.replace`` (atomic on POSIX within one file
system). A failure (a full disk: ``ENOSPC``) leaves the old file untouched and the temp file removed, and
the ``OSError`` names the file that could not be written. A process killed in the middle can leave a temp
file behind; :func:`remove_stale_temps` removes those of a folder whose writer is known to be gone.

No posenc imports (the run machinery is the lowest floor with the helpers), so that the figure helpers can use it.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_chunks", "atomic_write_json", "atomic_write_text", "fsync_dir",
           "named_os_error", "remove_stale_temps", "write_temp"]


def named_os_error(exc: OSError, path: Path) -> OSError:
    """``exc`` with the file it concerns in its message (``[Errno 28] No space left on device`` alone does not
    say which file); for a writer that cannot go through :func:`atomic_write_bytes` (a library that opens the file
    itself)."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        reason += " (the disk is full: free space, or write elsewhere)"
    return OSError(exc.errno, f"could not write {path}: {reason}")  # (a filename attribute would repeat it)


def write_temp(folder: Path, name: str, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to a fsynced temp file ``folder/.name.*.tmp``, ``chmod`` to ``mode`` (mkstemp makes
    0600; results, caches and checkpoints are ordinary readable files), and return its path; on failure the
    temp file is removed and the ``OSError`` names ``folder/name``."""
    folder = Path(folder)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    except OSError as exc:
        raise named_os_error(exc, folder / name) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException as exc:
        os.unlink(tmp)
        if isinstance(exc, OSError):
            raise named_os_error(exc, folder / name) from None
        raise
    return Path(tmp)


def fsync_dir(folder: Path) -> None:
    """Make the renames in ``folder`` durable (best effort: not every OS can fsync a directory)."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write to a temp file in the same folder, fsync, then ``os.replace`` (readers never see a
    partial file); the folder is created. Returns ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise named_os_error(exc, path) from None
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, f"could not write {path}: it is a folder")
    tmp = write_temp(path.parent, path.name, data)
    try:
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp.exists():
            tmp.unlink()
        if isinstance(exc, OSError):
            raise named_os_error(exc, path) from None
        raise
    return path


def atomic_write_chunks(path, chunks, verify=None) -> Path:
    """Write the byte blocks of ``chunks`` (an iterable: a file too large to hold in memory) to a temp file beside
    ``path``, fsync, call ``verify()`` (when given: whatever it raises leaves ``path`` as it was), then
    ``os.replace``. The temp file never outlives a failure; the ``OSError`` names ``path``. Returns ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise named_os_error(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            for block in chunks:
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        if verify is not None:
            verify()
        os.replace(tmp, path)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise named_os_error(exc, path) from None
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path, text: str, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write_bytes` of ``text`` encoded."""
    return atomic_write_bytes(path, text.encode(encoding))


def remove_stale_temps(folder: Path, names=None) -> list[Path]:
    """Remove the temp files (``.NAME.*.tmp``) that a killed writer left in ``folder`` (of ``names`` only,
    when given). Call it only while no other process writes the folder (its lock is held). Returns them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for p in folder.glob(".*.tmp"):
        stem = p.name[1:].rsplit(".", 2)[0]  # ".model.safetensors.ab12cd.tmp" -> "model.safetensors"
        if names is None or stem in names:
            try:
                p.unlink()
                removed.append(p)
            except FileNotFoundError:
                pass
    return removed


def atomic_write_json(path, obj, indent: int | None = 1, **kw):
    """``json.dumps(obj, indent=indent, **kw)`` written atomically (the whole text is built first, so a value
    that does not serialise leaves the old file untouched). Returns ``path`` as a ``Path``."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, **kw))
