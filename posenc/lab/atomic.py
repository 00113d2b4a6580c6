"""Atomic file writes: a reader sees the old file or the complete new one, never a partial one.

The implementation is :mod:`posenc._atomic` (layer 0, so that the figure helpers share it); this is the
lab's import path. A failed write (a full disk) names the file and leaves the old one in place."""

from __future__ import annotations

import json

from posenc._atomic import atomic_write_bytes, atomic_write_text, fsync_dir, remove_stale_temps, write_temp

__all__ = ["atomic_write_bytes", "atomic_write_json", "atomic_write_text", "fsync_dir", "remove_stale_temps",
           "write_temp"]


def atomic_write_json(path, obj, indent: int | None = 1, **kw):
    """``json.dumps(obj, indent=indent, **kw)`` written atomically (the whole text is built first, so a value
    that does not serialise leaves the old file untouched). Returns ``path`` as a ``Path``."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, **kw))
