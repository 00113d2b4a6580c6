"""Sizing the suite's keys per prefill: does the untouched model keep its accuracy as a noise context holds more keys?

    .venv/bin/python -m benchmarks.suite_keys_sizing [--model smollm2] [--length 8192] [--ks 1,2,4,8,16]
                                                     [--seeds 6,4,3,3,2]

A model (``--model``, default SmolLM2-135M-Instruct, ``smollm2``), untouched (a local/global hybrid on posenc's
identity path, as the suite runs it: :class:`posenc.evals.suite.spec.ModelFacts`), float32 on the CPU, at
``--length`` (SmolLM2: its trained length, 8192): for each K one
noise-haystack context per seed holding K labelled keys in the suite's distance bins
(:func:`posenc.tasks.ruler.keys`, bins :func:`posenc.tasks.ruler.key_bins` of the model's trained length), one
prefill, each key asked from the cache rewound after it (:func:`posenc.evals.suite.prefill.run_context`, as the suite
does). Written after every context to ``benchmarks/results/suite_keys_sizing.json`` (another model:
``suite_keys_sizing_<model>.json``; atomically) and resumed from it: a (K, seed)
already there is not run again. Per K: keys right of n with the Wilson 95% interval, and by distance bin; each
context records the machine's 1-minute load before and after it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.common import RESULTS, write_json

NAME = "suite_keys_sizing"


def _summary(contexts: list[dict], ks) -> dict:
    from posenc.evals.stats.intervals import wilson

    out = {}
    for k in ks:
        answers = [a for c in contexts if c["k"] == k for a in c["answers"]]
        if not answers:
            continue
        right = sum(a["correct"] for a in answers)
        iv = wilson(right, len(answers))
        bins = {}
        for b in sorted({a["bin"] for a in answers}):
            sel = [a for a in answers if a["bin"] == b]
            bins[str(b)] = {"k": sum(a["correct"] for a in sel), "n": len(sel)}
        out[str(k)] = {"k": right, "n": len(answers), "value": iv.value, "lo": iv.lo, "hi": iv.hi,
                       "contexts": sum(c["k"] == k for c in contexts), "by_bin": bins}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="a bundled model name, a folder or a .gguf file")
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--ks", default="1,2,4,8,16")
    p.add_argument("--seeds", default="6,4,3,3,2", help="contexts per K (seeds 0..n-1)")
    args = p.parse_args(argv)
    ks = [int(x) for x in args.ks.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    if len(seeds) != len(ks):
        raise SystemExit("--seeds: one count per K")

    import torch

    from posenc.evals.suite.prefill import run_context
    from posenc.evals.suite.spec import load_facts
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack
    from posenc.tasks.ruler import bin_of, key_bins

    name = NAME if args.model == "smollm2" else f"{NAME}_{Path(args.model).stem}"
    path = RESULTS / f"{name}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    contexts = [c for c in old.get("contexts", []) if c["length"] == args.length]
    m = load_facts(args.model)
    bins = key_bins(m.train_len)
    model = m.fresh("none", {})
    hay = make_haystack("noise", m.tokenizer)
    t_all = time.perf_counter()
    for k, n_seeds in zip(ks, seeds):
        for seed in range(n_seeds):
            if any(c["k"] == k and c["seed"] == seed for c in contexts):
                continue
            ctx = build_context(m.tokenizer, hay, args.length, ("keys",), seed,
                                options={"keys": {"n_keys": k, "bins": bins}})
            ctx.check(m.tokenizer)
            load = os.getloadavg()[0]
            v = run_context(model, m.tokenizer, ctx)
            answers = [{"correct": a["correct"], "distance": a["distance"], "bin": bin_of(a["distance"], bins),
                        "answer": a["answer"]} for a in v["answers"]]
            contexts.append({"k": k, "seed": seed, "length": args.length, "answers": answers,
                             "prefill_s": round(v["prefill_s"], 2), "loadavg": [load, os.getloadavg()[0]]})
            print(f"K={k} seed {seed}: {sum(a['correct'] for a in answers)}/{k} right, prefill "
                  f"{v['prefill_s']:.0f} s, load {load:.1f}", flush=True)
            write_json(name, {"model": args.model, "model_id": m.model_id, "train_len": m.train_len,
                              "length": args.length, "bins": bins, "threads": torch.get_num_threads(),
                              "by_k": _summary(contexts, ks), "contexts": contexts})
    print(f"done in {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
