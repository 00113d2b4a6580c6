"""Atomic file writes: a reader sees the old file or the complete new one, never a partial one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_temp(folder: Path, name: str, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to a fsynced temp file ``folder/.name.*.tmp``, ``chmod`` to ``mode`` (mkstemp makes
    0600; results, caches and checkpoints are ordinary readable files), and return its path; on failure the
    temp file is removed."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then ``os.replace`` (readers never see a
    partial file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = write_temp(path.parent, path.name, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def save_figure(fig, path, dpi: int) -> Path:
    """Render a matplotlib figure to PNG bytes in memory, then :func:`atomic_write_bytes` them (a full disk or a
    kill never leaves a truncated image). Returns ``path``."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path
