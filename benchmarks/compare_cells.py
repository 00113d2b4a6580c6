"""Compare a method's suite cells as committed at a git revision with the same cells computed again (same keys):
the scored loss, every answer, prefill seconds and peak memory, cell by cell. Used when an execution path changes
and the cells are re-run on the new one (the retrieval backend: ``blockwise`` before, ``retrieved`` after).

``python -m benchmarks.compare_cells --rev REV --old-cells OLD --cells DIR [--cells DIR] --method M --out F.json``
reads ``OLD/<cell>.json`` at ``REV`` (``git show``) for each cell of ``M`` in a folder ``DIR`` that differs from it
(a cell not re-run is left out).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from pathlib import Path

from posenc.runtime.atomic import atomic_write_text


def _old(rev: str, path: Path) -> dict | None:
    out = subprocess.run(["git", "show", f"{rev}:{path.as_posix()}"], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _ppl(value: dict) -> float | None:
    t = value.get("target")
    return None if not t else math.exp(t["loss"])


def compare(rev: str, old_dir: Path, new_dirs: list[Path], method: str) -> dict:
    rows = []
    for new_dir in new_dirs:
        for path in sorted(new_dir.glob("*.json")):
            new = json.loads(path.read_text())
            if new.get("key", {}).get("method") != method:
                continue
            old = _old(rev, old_dir / path.name)
            if old is None or old == new:  # not in the revision, or not re-run
                continue
            o, n = old["value"], new["value"]
            k = new["key"]
            rows.append({
                "cell": path.name, "length": k["length"], "context": f"{k['haystack']}:{'+'.join(k['generators'])}",
                "seed": k["seed"],
                "ppl_before": _ppl(o), "ppl_after": _ppl(n),
                "loss_abs_diff": None if _ppl(o) is None else abs(o["target"]["loss"] - n["target"]["loss"]),
                "answers_equal": [a["answer"] for a in o["answers"]] == [a["answer"] for a in n["answers"]],
                "correct_before": sum(a["correct"] for a in o["answers"]),
                "correct_after": sum(a["correct"] for a in n["answers"]), "n_answers": len(n["answers"]),
                "prefill_s_before": o["prefill_s"], "prefill_s_after": n["prefill_s"],
                "prefill_speedup": o["prefill_s"] / n["prefill_s"],
                "peak_rss_mb_before": o["peak_rss_mb"], "peak_rss_mb_after": n["peak_rss_mb"]})
    return {"revision": rev, "method": method, "cells": rows,
            "all_answers_equal": all(r["answers_equal"] for r in rows),
            "max_loss_abs_diff": max((r["loss_abs_diff"] for r in rows if r["loss_abs_diff"] is not None),
                                     default=None)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.compare_cells", description=__doc__.splitlines()[0])
    p.add_argument("--rev", required=True, help="the git revision holding the earlier cells")
    p.add_argument("--old-cells", required=True, help="the cells folder at that revision (repository path)")
    p.add_argument("--cells", action="append", required=True, help="a folder with re-run cells (repeatable)")
    p.add_argument("--method", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    res = compare(a.rev, Path(a.old_cells), [Path(c) for c in a.cells], a.method)
    atomic_write_text(Path(a.out), json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "cells"}))
    for r in res["cells"]:
        print(r["length"], r["context"], r["seed"], f"{r['prefill_s_before']:.0f} s -> {r['prefill_s_after']:.0f} s",
              "answers equal" if r["answers_equal"] else "ANSWERS DIFFER")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
