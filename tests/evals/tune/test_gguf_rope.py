"""posenc.evals.tune.gguf_rope: llama.cpp's GGUF rope keys for YaRN, written and read back, and the refusals."""

from __future__ import annotations

import pytest

from posenc.evals.tune.gguf_rope import read_rope_gguf, write_rope_gguf


def test_gguf_rope_keys_for_yarn_and_refusals(tmp_path):
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 1024,
           "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5,
                               "original_max_position_embeddings": 256}}
    back = read_rope_gguf(write_rope_gguf(tmp_path / "y.gguf", cfg))
    assert (back["scaling_type"], back["factor"], back["original_context_length"], back["context_length"]) == \
        ("yarn", 4.0, 256, 1024)
    assert back["long_factor"] is None and back["rope_theta"] == pytest.approx(5e5)
    with pytest.raises(ValueError, match="llama.cpp fixes them when the context is made"):
        write_rope_gguf(tmp_path / "d.gguf", {**cfg, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})


YARN = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 1024,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5,
                            "original_max_position_embeddings": 256}}


def test_a_full_disk_names_rope_gguf_keeps_the_previous_file_and_leaves_no_temp(tmp_path, monkeypatch):
    """ENOSPC injected while the tensors are written: one ``OSError`` naming the file, the previous ``rope.gguf``
    byte for byte, no temp file (``test_a_full_tmpfs_...`` below: the real fault)."""
    import errno

    import gguf

    path = write_rope_gguf(tmp_path / "rope.gguf", YARN)
    before = path.read_bytes()

    def full(self, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full)
    with pytest.raises(OSError, match=r"could not write .*rope\.gguf: No space left on device \(the disk is full"):
        write_rope_gguf(path, {**YARN, "max_position_embeddings": 4096})
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["rope.gguf"]


FULL_TMPFS = r"""
import json, os, sys
from pathlib import Path
from posenc.evals.tune.gguf_rope import read_rope_gguf, write_rope_gguf

disk = Path(sys.argv[1])
cfg = json.loads(os.environ["CFG"])
write_rope_gguf(disk / "rope.gguf", cfg)
before = (disk / "rope.gguf").read_bytes()
fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)  # fill the file system to the last byte
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError:
    pass
try:
    while True:
        os.write(fd, b"x")
except OSError:
    pass
os.close(fd)
try:
    write_rope_gguf(disk / "rope.gguf", {**cfg, "max_position_embeddings": 4096})
    error = None
except OSError as exc:
    error = str(exc)
print(json.dumps({"error": error, "same": (disk / "rope.gguf").read_bytes() == before,
                  "files": sorted(p.name for p in disk.iterdir())}))
"""


def test_a_full_tmpfs_names_rope_gguf_keeps_the_previous_file_and_leaves_no_temp(tmp_path):
    """The real fault: a 1 MiB tmpfs filled to the last byte (``unshare -rm``; skipped with the reason where user
    namespaces are not available, the injected test above covering the same path)."""
    import json
    import sys

    from tests.runtime.test_atomic import _on_a_1mib_tmpfs

    disk = tmp_path / "disk"
    proc = _on_a_1mib_tmpfs(disk, f"{sys.executable} -c \"$SCRIPT\" {disk}", SCRIPT=FULL_TMPFS, CFG=json.dumps(YARN))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] is not None and f"could not write {disk}/rope.gguf: No space left" in out["error"]
    assert out["same"] and out["files"] == ["filler", "rope.gguf"]
