"""posenc.runtime.atomic: a full disk leaves the previous file intact and names the file; temp files of a killed
writer go; a folder is never written over; written files are ordinary readable files."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import posenc.runtime.atomic as A
from posenc.runtime.atomic import atomic_write_bytes, atomic_write_json, remove_stale_temps

ROOT = Path(__file__).resolve().parents[2]

FULL_DISK = r"""
import json, os, sys
from pathlib import Path
from posenc.runtime.atomic import atomic_write_json
from posenc.evals.report.lab import write_report

disk = Path(sys.argv[1])
old = {"meta": {"preset": "old"}, "records": [], "retrieval": []}
atomic_write_json(disk / "results.json", old)
write_report(old, disk)  # report.md, report.html and the (empty) plots of the old results
before = {p.name: p.read_bytes() for p in disk.iterdir()}
fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)  # fill the file system to the last few kB
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError:
    pass
os.close(fd)
os.truncate(disk / "filler", os.path.getsize(disk / "filler") - 8192)
new = {"meta": {"preset": "new", "pad": "y" * 200_000}, "records": [], "retrieval": []}
errors = []
for write in (lambda: atomic_write_json(disk / "results.json", new), lambda: write_report(new, disk)):
    try:
        write()
        errors.append(None)
    except OSError as exc:
        errors.append([exc.errno, str(exc)])
after = {p.name: p.read_bytes() for p in disk.iterdir() if p.name != "filler"}
print(json.dumps({"errors": errors, "same": after == before,
                  "results_ok": json.loads((disk / "results.json").read_text())["meta"]["preset"]}))
"""


def _on_a_1mib_tmpfs(disk: Path, then: str, **env) -> subprocess.CompletedProcess:
    """Run the shell command ``then`` after mounting a 1 MiB tmpfs on ``disk`` (created) inside a user+mount
    namespace (``unshare -rm``): a real file system that fills up. Skips where namespaces are not available."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed; test_full_disk_simulated covers the same path")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not available here ({probe.stderr.decode().strip()}); "
                    f"test_full_disk_simulated covers the same path")
    disk.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", **env}
    return subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {disk} && {then}"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_full_tmpfs_keeps_the_previous_results_json_and_report_and_names_the_file(tmp_path):
    """A real full file system: a 1 MiB tmpfs mounted in a user+mount namespace (``unshare -rm``)."""
    disk = tmp_path / "disk"
    proc = _on_a_1mib_tmpfs(disk, f"{sys.executable} -c \"$SCRIPT\" {disk}", SCRIPT=FULL_DISK)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    (code, msg), (code2, msg2) = out["errors"]
    assert code == errno.ENOSPC and f"could not write {disk}/results.json: No space left on device" in msg
    assert code2 == errno.ENOSPC and f"could not write {disk}/" in msg2  # the first report file that did not fit
    assert out["same"] and out["results_ok"] == "old"  # nothing torn, no temp file left behind


FILL = """
import os, sys
fd = os.open(os.path.join(sys.argv[1], "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError:
    pass
"""


def test_cli_eval_on_a_full_tmpfs_is_one_line_naming_results_json(run_dir, tmp_path):
    """`posenc eval RUN --out DIR` on a real full file system: exit 2, one line naming DIR/results.json (not a
    bare ``[Errno 28]``, not the hidden staging folder), no DIR, no staging folder or temp file left, and the
    previous run's folder on the same disk intact (eval writes a new folder: it refuses one holding results)."""
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    disk, py = tmp_path / "disk", sys.executable
    evaluate = f"{py} -m posenc eval {run_dir} --corpus {text} --quiet --lengths"
    proc = _on_a_1mib_tmpfs(disk, f"{evaluate} 32 --out {disk}/out > /dev/null && cp {disk}/out/results.json "
                                  f"{tmp_path}/before && {py} -c \"$FILL\" {disk} && {evaluate} 32 64 --out "
                                  f"{disk}/out2; echo $? > {tmp_path}/rc; ls -a {disk} {disk}/out > {tmp_path}/after; "
                                  f"cp {disk}/out/results.json {tmp_path}/now",
                            FILL=FILL)
    assert proc.returncode == 0 and (tmp_path / "rc").read_text().strip() == "2", proc.stderr[-3000:]
    assert proc.stderr.strip() == (f"posenc: error: [Errno 28] could not write {disk}/out2/results.json: No space "
                                   f"left on device (the disk is full: free space, or write elsewhere)")
    assert (tmp_path / "now").read_bytes() == (tmp_path / "before").read_bytes()  # the previous run's, whole
    assert json.loads((tmp_path / "now").read_text())["meta"]["lengths"] == [32]
    left = (tmp_path / "after").read_text().split()
    assert "out2" not in left and not [n for n in left if n.endswith(".tmp") or "staging" in n]


def test_full_disk_simulated(tmp_path, monkeypatch):
    """ENOSPC at the write itself (monkeypatched), for machines without user namespaces."""
    path = tmp_path / "results.json"
    atomic_write_json(path, {"v": 1})
    real = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(A.os, "fdopen", lambda fd, *a, **kw: Full(real(fd, *a, **kw)))
    with pytest.raises(OSError, match=rf"could not write {path}: No space left on device \(the disk is full"):
        atomic_write_json(path, {"v": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_cli_prints_a_full_disk_as_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    from posenc.cli import main

    def full(path, data):
        raise A.named_os_error(OSError(errno.ENOSPC, "No space left on device"), Path(path))

    monkeypatch.setattr(A, "atomic_write_bytes", full)  # what save_png writes through
    assert main(["plot", "decay", "--out", str(tmp_path / "e.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("posenc: error: [Errno 28] could not write ") and err.endswith(
        "e.png: No space left on device (the disk is full: free space, or write elsewhere)")


def test_stale_temp_files_are_removed_by_name(tmp_path):
    for name in (".results.json.ab_12.tmp", ".model.safetensors.zz.tmp", "keep.tmp", ".other.x.tmp"):
        (tmp_path / name).write_text("x")
    assert {p.name for p in remove_stale_temps(tmp_path, ["model.safetensors", "results.json"])} == {
        ".results.json.ab_12.tmp", ".model.safetensors.zz.tmp"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.x.tmp", "keep.tmp"]


def test_writing_over_a_folder_is_refused_by_name(tmp_path):
    (tmp_path / "out.json").mkdir()
    with pytest.raises(IsADirectoryError, match="out.json: it is a folder"):
        atomic_write_bytes(tmp_path / "out.json", b"{}")


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


def test_atomic_writes_are_ordinary_readable_files(tmp_path):
    """mkstemp makes 0600 files; a written cache entry or result is 0644 like a checkpoint."""
    atomic_write_bytes(tmp_path / "f.bin", b"x")
    assert (tmp_path / "f.bin").stat().st_mode & 0o777 == 0o644
