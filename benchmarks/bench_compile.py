"""Compile cost of the flex path: first-call time per length in a fresh process, and how the cache of
compiled callables amortises it (same length again; a new length; back to the first length).

``torch.compile(flex_attention, dynamic=False)`` specialises on shapes, so each new length compiles once;
Inductor's on-disk cache (``/tmp/torchinductor_$USER``) can make a later process's first call cheaper, so
both a first and a second fresh process are reported.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from benchmarks.common import cli, peak_memory_subprocess


def _sequence(lengths: list) -> dict:
    from posenc.engine import attention
    from posenc.scheme.core import PositionScheme

    sc = PositionScheme.preset("alibi")
    out = []
    with torch.no_grad():
        for N in [*lengths, lengths[0]]:
            q, k, v = (torch.randn(1, 4, N, 64) for _ in range(3))
            for call in ("first", "second"):
                t0 = time.perf_counter()
                attention(q, k, v, sc, impl="flex")
                out.append({"N": N, "call": call, "seconds": time.perf_counter() - t0})
    return {"calls": out}


def run(quick: bool = False, n: int | None = None) -> dict:
    lengths = [n] if n else ([256] if quick else [1024, 2048, 4096])
    procs = [peak_memory_subprocess("benchmarks.bench_compile", ["--child", *lengths]) for _ in range(2)]
    summary = {}
    for i, p in enumerate(procs):
        for j, c in enumerate(p.get("calls", [])):
            summary[f"proc{i + 1}_{j}_N{c['N']}_{c['call']}_s"] = round(c["seconds"], 3)
    p1 = procs[0].get("calls", [])
    if len(p1) >= 2:
        summary[f"first_over_warm_call_N{p1[0]['N']}"] = p1[0]["seconds"] / max(p1[1]["seconds"], 1e-9)
    return {"config": {"lengths": lengths, "scheme": "alibi", "shape": "1 x 4 x N x 64", "quick": quick},
            "processes": procs, "summary": summary}


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        print(json.dumps(_sequence([int(a) for a in sys.argv[2:]])))
        raise SystemExit(0)
    raise SystemExit(cli("bench_compile", run))
