"""STRING at the trained length: is the original's attention factor what the suite's 8k STRING row lacked?

    .venv/bin/python -m benchmarks.string_at_trained_length [--seeds 0-7] [--length 8192]

The suite's full SmolLM2 run found STRING (shift S = L/3 = 2730, local W = 128: its authors' rule) at SmolLM2's
trained length 8192 losing every pass key (0 of 4) that the untouched model found 3 of 4 of. posenc's positions equal
the original's (``tests/methods/test_string_original.py``); the one convention of the original not applied there is
its attention factor: ``string_for_llama.py`` multiplies cos and sin of q and k by ``0.1 ln 2 + 1 = 1.0693``, every
logit by its square. This runs, on the same noise haystack with one pass key (the suite's ``noise:passkey`` contexts,
seeds ``--seeds``), the untouched model, STRING as the suite ran it (attention factor 1) and STRING with the
original's factor, one prefill per (row, seed), the key asked from the cache (:func:`posenc.evals.suite.prefill.
run_context`). Written after every context to ``benchmarks/results/string_at_trained_length.json`` (atomically) and
resumed from it; each context records the 1-minute load before and after it (this is a correctness run, not a
timing: a loaded machine changes no answer).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from benchmarks.common import RESULTS, seed_range, write_json

NAME = "string_at_trained_length"
FACTOR = 0.1 * math.log(2.0) + 1.0  # string_for_llama.py: cos and sin of q and k times this
ROWS = {"none": ("none", {}), "string": ("string", {}),
        "string@original_factor": ("string", {"attention_factor": FACTOR})}


def summary(contexts: list[dict]) -> dict:
    from posenc.evals.stats.intervals import wilson

    out = {}
    for row in ROWS:
        sel = [c for c in contexts if c["row"] == row]
        if sel:
            k = sum(c["correct"] for c in sel)
            iv = wilson(k, len(sel))
            out[row] = {"k": k, "n": len(sel), "value": iv.value, "lo": iv.lo, "hi": iv.hi,
                        "seeds": sorted(c["seed"] for c in sel)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-7")
    p.add_argument("--length", type=int, default=8192)
    args = p.parse_args(argv)
    seeds = seed_range(args.seeds)

    from posenc.evals.suite.prefill import run_context
    from posenc.evals.suite.spec import load_facts, method_params
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack

    path = RESULTS / f"{NAME}.json"
    contexts = json.loads(path.read_text())["contexts"] if path.exists() else []
    m = load_facts("smollm2")
    hay = make_haystack("noise", m.tokenizer)
    t_all = time.perf_counter()
    for row, (method, extra) in ROWS.items():
        todo = [s for s in seeds if not any(c["row"] == row and c["seed"] == s and c["length"] == args.length
                                            for c in contexts)]
        if not todo:
            continue
        params = {**method_params(method, m.train_len, args.length, m.head_dim, m.base, {}), **extra}
        model = m.fresh(method, params)
        for seed in todo:
            ctx = build_context(m.tokenizer, hay, args.length, ("passkey",), seed)
            load = os.getloadavg()[0]
            v = run_context(model, m.tokenizer, ctx)
            a = v["answers"][0]
            contexts.append({"row": row, "params": params, "seed": seed, "length": args.length,
                             "correct": a["correct"], "distance": a["distance"], "answer": a["answer"],
                             "loadavg": [load, os.getloadavg()[0]]})
            print(f"{row} seed {seed}: {'right' if a['correct'] else 'wrong'} ({a['distance']} back): "
                  f"{a['answer']!r}", flush=True)
            write_json(NAME, {"model": "smollm2", "model_id": m.model_id, "length": args.length,
                              "attention_factor": FACTOR, "summary": summary(contexts), "contexts": contexts})
        del model
    print(f"done in {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
