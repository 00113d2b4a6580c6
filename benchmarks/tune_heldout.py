"""The committed tunes re-scored on held-out contexts: do their rankings survive contexts the suite never reads?

    .venv/bin/python -m benchmarks.tune_heldout [--tune benchmarks/results/tune-smollm2-16k] [--top 6]

The committed SmolLM2 tunes (``benchmarks/results/tune-smollm2-16k`` and ``-32k``) scored their candidates on the
suite's own seed-0 pass keys (a book one and a noise one), so their recommendations were chosen on keys the suite
then reported. ``posenc tune``'s default contexts are now held out from every suite context
(:data:`posenc.evals.tune.objective.DEFAULT_CONTEXTS`: other books, seed 1000). This re-scores the ``--top``
candidates of a committed tune, and its winner, on those contexts with the same objective (loss on the target
passage + weight x (1 - retrieval)), and writes both rankings side by side to
``benchmarks/results/tune_heldout_<length>.json`` (atomically, after every candidate; the prefills are cells under
``benchmarks/results/tune_heldout/cells``, so a rerun resumes). A correctness run, not a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.common import RESULTS, write_json


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tune", default=str(RESULTS / "tune-smollm2-16k"), help="a committed tune's folder")
    p.add_argument("--top", type=int, default=6, help="how many of its best candidates to re-score")
    p.add_argument("--out", default=str(RESULTS), help="where the JSON and the cells go (default: benchmarks/results)")
    args = p.parse_args(argv)
    out_dir = Path(args.out)
    folder = Path(args.tune)
    try:
        tuned = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--tune: no readable results.json in {folder} ({exc})") from None
    if args.top < 1:
        raise SystemExit(f"--top must be >= 1, got {args.top}")

    from posenc.evals.tune.objective import DEFAULT_CONTEXTS, TuneObjective

    meta = tuned["meta"]
    rows = sorted(tuned["rows"], key=lambda r: r["score"])[:args.top]
    obj = TuneObjective(meta["model"], meta["length"], out_dir / "tune_heldout" / "cells", DEFAULT_CONTEXTS,
                        target=meta["target_tokens"], weight=meta["weight"])
    name = f"tune_heldout_{meta['length']}"
    out = []
    t0 = time.perf_counter()
    for rank, row in enumerate(rows, 1):
        load = os.getloadavg()[0]
        rec = obj.evaluate(row["method"], row["params"])
        out.append({"method": row["method"], "params": row["params"], "tune_rank": rank, "tune_score": row["score"],
                    "tune_retrieval": row["retrieval"], "tune_ppl": row["ppl"], "heldout_score": rec["score"],
                    "heldout_retrieval": rec["retrieval"], "heldout_ppl": rec["ppl"],
                    "heldout_loss_interval": [rec["loss_lo"], rec["loss_hi"]],
                    "loadavg": [round(load, 2), round(os.getloadavg()[0], 2)]})
        print(f"#{rank} {row['method']} {row['params']}: tune {row['score']:.3f} (retrieval {row['retrieval']:.2f}),"
              f" held out {rec['score']:.3f} (retrieval {rec['retrieval']:.2f}, ppl {rec['ppl']:.1f})", flush=True)
        order = sorted(range(len(out)), key=lambda i: out[i]["heldout_score"])
        for i, j in enumerate(order, 1):
            out[j]["heldout_rank"] = i
        write_json(name, {"model": meta["model"], "model_id": meta["model_id"], "length": meta["length"],
                          "tune": folder.name, "tune_contexts": meta["contexts"],
                          "heldout_contexts": [list(c) for c in DEFAULT_CONTEXTS], "weight": meta["weight"],
                          "target_tokens": meta["target_tokens"], "candidates": out,
                          "tune_winner": tuned.get("winner"),
                          "heldout_winner": out[order[0]]}, out_dir)
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
