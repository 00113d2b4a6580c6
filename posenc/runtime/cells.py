"""Finished cells of a long run, kept on disk so that an interrupted run continues where it stopped.

A long evaluation (a bench preset, the real-model suite) is a grid of independent *cells*: one model under
one method at one length, say. :class:`CellStore` keeps each finished cell as its own JSON file
``folder/<digest>.json`` holding ``{"key": key, "value": value}``, written atomically
(:func:`posenc.runtime.atomic.atomic_write_bytes`): a kill at any moment leaves every cell either absent or
complete. A run asks :meth:`CellStore.get` before computing a cell and :meth:`CellStore.put` after.
Where several processes may compute one cell (workers of a cluster, a task retried after its worker died),
:meth:`CellStore.put_once` writes it exclusively: the first finished value is the cell, the others are dropped.

The key is a JSON-able dict that names everything the cell's result depends on (the model, the method and
its parameters, the length, the seed, the data's digest, ...); its file name is the SHA-256 of its
canonical JSON. Change anything in the key and the cell is computed anew; a file that does not parse or
whose stored key differs from the asked one is treated as missing, and so is a file that parses but whose value
the store's ``check`` refuses (a damaged value: a field missing or of the wrong type). A run computes a missing cell
again and its :meth:`CellStore.put` replaces the damaged file, as it does a truncated one: the value is a pure
function of its key, so recomputing it loses nothing, while refusing would stop a long run over one bad file.

A writer killed in the middle of :meth:`CellStore.put` leaves its temp file ``.<digest>.json.*.tmp``;
:meth:`CellStore.remove_stale_temps` removes them, called by a run that holds the folder's lock (no other writer).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from posenc.runtime.atomic import atomic_write_bytes, fsync_dir, remove_stale_temps, write_temp

__all__ = ["CellStore", "cell_digest"]


def _canonical(key: dict) -> str:
    if not isinstance(key, dict):
        raise ValueError(f"a cell key must be a dict, got {type(key).__name__}")
    try:
        return json.dumps(key, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a cell key must be plain JSON (str, int, float, bool, None, lists, dicts): {exc}") from exc


def cell_digest(key: dict) -> str:
    """The file stem of ``key``: the first 24 hex digits of the SHA-256 of its canonical JSON."""
    return hashlib.sha256(_canonical(key).encode()).hexdigest()[:24]


class CellStore:
    """The finished cells under ``folder`` (created on first :meth:`put`). ``check``: a function of a stored value
    that says whether it is whole (True) or damaged (False, or it raises ``KeyError``/``TypeError``/``ValueError``/
    ``IndexError``/``AttributeError``); a damaged value reads as missing (module docstring). None: every value that
    parses is taken."""

    def __init__(self, folder, check=None):
        self.folder = Path(folder)
        self.check = check

    def path(self, key: dict) -> Path:
        return self.folder / f"{cell_digest(key)}.json"

    def get(self, key: dict):
        """The stored value of ``key``, or None when the cell is not finished."""
        path = self.path(key)
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(row, dict) or _canonical(row.get("key", None) or {}) != _canonical(key):
            return None
        value = row.get("value")
        return value if self._whole(value) else None

    def _whole(self, value) -> bool:
        """Whether ``value`` is a finished cell's value: not None and, with a ``check``, accepted by it."""
        if value is None or self.check is None:
            return value is not None
        try:
            return bool(self.check(value))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return False

    def __contains__(self, key: dict) -> bool:
        return self.get(key) is not None

    def put(self, key: dict, value) -> None:
        """Store a finished cell (``value`` plain JSON, not None), atomically."""
        if value is None:
            raise ValueError("a finished cell's value must not be None (None reads back as 'not finished')")
        atomic_write_bytes(self.path(key), _row(key, value))

    def put_once(self, key: dict, value) -> bool:
        """Store a finished cell unless it is stored already; returns whether this call stored it.

        The file is created exclusively and atomically: the row goes to a fsynced temp file that is then hard-linked
        to the cell's name (``os.link`` fails when the name exists), so of two writers of one cell exactly one
        writes it, a reader never sees a partial file, and a finished cell is never rewritten. A file under the name
        that does not hold the cell (it does not parse, or holds another key) is replaced. On a file system without
        hard links the name is checked first, then replaced atomically (two writers at the same instant may then
        both write; each file is complete)."""
        if value is None:
            raise ValueError("a finished cell's value must not be None (None reads back as 'not finished')")
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = write_temp(path.parent, path.name, _row(key, value))
        try:
            os.link(tmp, path)
        except FileExistsError:
            if self.get(key) is not None:
                return False
            os.replace(tmp, path)  # a broken file under the name: the cell was never stored
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            if self.get(key) is not None:
                return False
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        fsync_dir(path.parent)
        return True

    def items(self) -> Iterator[tuple[dict, object]]:
        """Every finished ``(key, value)`` (files that do not parse are skipped)."""
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob("*.json")):
            try:
                row = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if (isinstance(row, dict) and isinstance(row.get("key"), dict) and path.stem == cell_digest(row["key"])
                    and self._whole(row.get("value"))):
                yield row["key"], row.get("value")

    def remove_stale_temps(self) -> list[Path]:
        """Remove the temp files of cells (``.<digest>.json.*.tmp``) that killed writers left; returns them. Call it
        only while holding the folder's lock (:class:`posenc.runtime.lock.FolderLock`): a live writer's temp file
        would go too."""
        if not self.folder.is_dir():
            return []
        names = {p.name[1:].rsplit(".", 2)[0] for p in self.folder.glob(".*.json.*.tmp")}
        return remove_stale_temps(self.folder, {n for n in names if _is_cell_name(n)})

    def __len__(self) -> int:
        return sum(1 for _ in self.items())


def _is_cell_name(name: str) -> bool:
    """``<24 hex digits>.json``: the name of a cell's file."""
    stem, _, ext = name.partition(".")
    return ext == "json" and len(stem) == 24 and all(c in "0123456789abcdef" for c in stem)


def _row(key: dict, value) -> bytes:
    """The file's bytes: ``{"key": key, "value": value}`` as JSON."""
    return json.dumps({"key": key, "value": value}, indent=1, allow_nan=True, default=_jsonable).encode()


def _jsonable(x):
    """numpy scalars and arrays as plain JSON."""
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")
