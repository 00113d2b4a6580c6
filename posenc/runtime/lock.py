"""One writer per folder: :class:`FolderLock`, an exclusive ``flock`` on ``folder/.posenc.lock``.

A run folder (``posenc train --out``, ``posenc bench --out``, a real-model suite run) is written by one
process at a time. A second process that tries to take the lock gets :class:`FolderInUseError` (a
``ValueError``: the CLI prints it as one line) naming the holder's pid, start time and command, instead of
silently interleaving its files with the first one's.

``flock`` locks belong to the open file description: the operating system releases them when the holder
exits, however it exits (``SIGKILL`` included), so a killed run never leaves a stale lock behind. The lock
file itself stays (deleting it would race with a process that just opened it); its content is only
information for the error message.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

__all__ = ["FolderInUseError", "FolderLock", "LOCK_NAME"]

LOCK_NAME = ".posenc.lock"


class FolderInUseError(ValueError):
    """Another process holds the folder's lock."""


class FolderLock:
    """``with FolderLock(folder, what="run"):`` holds ``folder``'s lock for the block (the folder is
    created). Re-entrant within one object: :meth:`acquire` on a held lock is a no-op. With ``tidy``, a
    folder the lock created and that holds nothing but the lock file when released is removed (a run that
    failed before writing anything leaves no empty folder behind)."""

    def __init__(self, folder, what: str = "folder", tidy: bool = False):
        self.folder = Path(folder)
        self.what = what
        self.tidy = tidy  # remove the folder on release when this lock created it and nothing else was put there
        self._fd: int | None = None
        self._created = False

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait: float = 0.0) -> FolderLock:
        """Take the lock, waiting up to ``wait`` seconds for another holder to let go (default: not at all),
        else raise :class:`FolderInUseError`."""
        if self._fd is not None:
            return self
        self._created = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.2)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise FolderInUseError(f"{self.what} folder {str(self.folder)!r} is in use by another posenc process "
                                   f"({holder}); wait for it to finish, or choose another folder") from None
        except BaseException:
            os.close(fd)
            raise
        info = {"pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
            if self.tidy and self._created and [p.name for p in self.folder.iterdir()] == [LOCK_NAME]:
                self.path.unlink()  # while still held: a command that failed before writing leaves no folder
                self.folder.rmdir()
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """The holder's pid, start time and command from the lock file, as text (best effort)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "holder unknown"
    return f"pid {info.get('pid')}, since {info.get('started')}, command: {info.get('command')}"
