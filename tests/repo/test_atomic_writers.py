"""Every writer of results, reports, JSON and PNG in the package goes through posenc.runtime.atomic (a scan of
the source)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# a direct write to a path: Path.write_text/write_bytes, open(path, "w"/"a"/"x"), savefig to anything but the
# in-memory buffer of posenc._figures.save_png, torch.save / safetensors' save_file to a path
DIRECT_WRITE = re.compile(r"\.write_(text|bytes)\(|\bopen\([^)]*['\"][wax]b?\+?['\"]|\.savefig\((?!buf\b)"
                          r"|\btorch\.save\(|\bsave_file\(")


def test_every_writer_of_results_and_reports_is_atomic():
    """No direct write (:data:`DIRECT_WRITE`) left in the package's writers of user-facing files."""
    assert DIRECT_WRITE.search('Path("r.json").write_text(s)') and DIRECT_WRITE.search('open(p, "w")')
    assert DIRECT_WRITE.search("fig.savefig(path, dpi=100)") and not DIRECT_WRITE.search("fig.savefig(buf, dpi=1)")
    offenders = []
    for path in sorted((ROOT / "posenc").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DIRECT_WRITE.search(line) and "clear_refs" not in line:  # /proc/self/clear_refs is no file
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert offenders == []
