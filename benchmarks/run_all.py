"""Run every benchmark module and write ``results/<module>.json`` plus ``results/perf.md``.

``python -m benchmarks.run_all [--quick] [--out DIR] [--only bench_rope,...]``; ``posenc perf`` calls this.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
import traceback
from pathlib import Path

from benchmarks.common import RESULTS, write_json
from posenc.runtime.atomic import atomic_write_text

MODULES = ("bench_rope", "bench_attention", "bench_training", "bench_compile", "bench_generation",
           "bench_real_model", "bench_jobs", "bench_retrieval")


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def _flatten(d: dict, prefix: str = "") -> list:
    rows = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            rows += _flatten(v, key + ".")
        elif not isinstance(v, list):
            rows.append((key, v))
    return rows


def render_markdown(out: Path, quick: bool | None = None) -> str:
    """``perf.md`` from every benchmark JSON in ``out`` (the modules of :data:`MODULES` that have one), each
    section with the machine, load and mode its JSON records: a module re-run alone (``--only``, or ``python -m
    benchmarks.NAME``) updates its section and keeps the others, and no section claims another run's machine."""
    lines = ["# posenc performance", "",
             "Timings are medians of interleaved repeats (min/max in the JSON); ratios compare peers of the "
             "same run. The machine is shared, so absolute times are noisy; ratios are the result. Each section "
             "names the machine and load of its own run (its JSON's `machine`).", ""]
    for name in MODULES:
        path = Path(out) / f"{name}.json"
        if not path.exists():
            continue
        res = json.loads(path.read_text())
        m = res.get("machine", {})
        mode = res.get("perf_mode") or ("quick (smoke sizes)" if quick else "full" if quick is not None else "")
        lines += [f"## {name}", "",
                  f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores (torch threads "
                  f"{m.get('torch_threads', '?')}), torch {m.get('torch', '?')}, load average "
                  f"{' '.join(m.get('loadavg', [])) or '?'}" + (f"; wall {res['wall_s']:.0f} s" if "wall_s" in res
                                                               else "") + (f". Mode: {mode}." if mode else "."), ""]
        if "error" in res:
            lines += [f"failed: `{res['error']}`", ""]
            continue
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in _flatten(res.get("summary", {}))]
        if res.get("notes"):
            lines += ["", "Notes: " + json.dumps(res["notes"])]
        lines += [""]
    return "\n".join(lines)


def run_all(quick: bool = False, out=None, only=None) -> dict:
    out = Path(out) if out is not None else RESULTS
    results = {}
    for name in MODULES:
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        print(f"[perf] {name} ...", flush=True)
        try:
            res = importlib.import_module(f"benchmarks.{name}").run(quick=quick)
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
            res = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        res["wall_s"] = time.perf_counter() - t0
        res["perf_mode"] = "quick (smoke sizes)" if quick else "full"
        write_json(name, res, out)
        results[name] = res
        print(f"[perf] {name} done in {res['wall_s']:.0f}s", flush=True)
    atomic_write_text(out / "perf.md", render_markdown(out))
    print(f"[perf] wrote {out / 'perf.md'}")
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.run_all")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--only", default="", help="comma-separated module names")
    a = p.parse_args(argv)
    res = run_all(a.quick, a.out, [s for s in a.only.split(",") if s] or None)
    return 1 if any("error" in r for r in res.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
