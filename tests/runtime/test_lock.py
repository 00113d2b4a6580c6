"""FolderLock: one writer per folder; the OS releases the lock of a killed holder."""

import os
import signal
import subprocess
import sys
import time

import pytest

from posenc.runtime.lock import LOCK_NAME, FolderInUseError, FolderLock

HOLD = """
import sys, time
from posenc.runtime.lock import FolderLock
lock = FolderLock(sys.argv[1], what="run").acquire()
print("held", flush=True)
time.sleep(60)
"""


def _holder(folder):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_process_is_refused_with_the_holder_named(tmp_path):
    p = _holder(tmp_path)
    try:
        with pytest.raises(FolderInUseError, match=rf"run folder .* in use .*pid {p.pid}"):
            FolderLock(tmp_path, what="run").acquire()
    finally:
        p.kill()
        p.wait()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    p = _holder(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    with FolderLock(tmp_path) as lock:  # taken at once, no cleanup needed
        assert lock.held
    assert (tmp_path / LOCK_NAME).exists()


def test_two_locks_in_one_process_exclude_each_other_and_release(tmp_path):
    a = FolderLock(tmp_path).acquire()
    assert a.acquire() is a  # re-entrant on the same object
    with pytest.raises(FolderInUseError):
        FolderLock(tmp_path).acquire()  # flock is per open file: a second open conflicts
    a.release()
    a.release()  # idempotent
    with FolderLock(tmp_path):
        pass


def test_lock_creates_the_folder(tmp_path):
    folder = tmp_path / "new" / "run"
    with FolderLock(folder):
        assert folder.is_dir()
    t = time.time()
    FolderLock(folder).acquire().release()
    assert time.time() - t < 5


def test_acquire_waits_for_a_holder_that_lets_go(tmp_path):
    p = _holder(tmp_path)
    t = time.monotonic()
    with pytest.raises(FolderInUseError):
        FolderLock(tmp_path).acquire(wait=0.5)  # the holder sleeps 60 s
    assert time.monotonic() - t >= 0.5
    p.kill()
    p.wait()
    with FolderLock(tmp_path).acquire(wait=5):
        pass


def test_tidy_removes_only_a_folder_it_created_and_left_empty(tmp_path):
    new = tmp_path / "a" / "run"
    with FolderLock(new, tidy=True):
        assert (new / LOCK_NAME).exists()
    assert not new.exists()  # nothing was written: no empty folder is left behind
    with FolderLock(new, tidy=True):
        (new / "model.safetensors").write_bytes(b"x")
    assert sorted(p.name for p in new.iterdir()) == [LOCK_NAME, "model.safetensors"]
    old = tmp_path / "existing"
    old.mkdir()
    with FolderLock(old, tidy=True):
        pass
    assert old.is_dir()  # not created by the lock: kept
