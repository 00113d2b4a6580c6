"""Short trainings that size the key-matching probe (posenc.tasks.kv_recall) for the lab's quick recipe.

``python -m benchmarks.kv_recall_design OUT_DIR NAME RECALL_ROWS WEIGHT PAIRS STEPS LR [TEXT_ROWS [SCHEME]]``
trains quick's model (RoPE unless SCHEME; dim 128, 2 layers, L = 64, TEXT_ROWS (16) text rows per step, lr
warmup 100 then cosine) with RECALL_ROWS kv rows of PAIRS definitions at loss weight WEIGHT for STEPS steps,
then scores ``kv_recall`` and ``offset`` at L = 64 and 4L = 256 (64 probe sequences per cell, Wilson 95%
intervals) and the content-copy control, and appends one JSON line to ``OUT_DIR/kv_recall_design.jsonl``.
The committed measurements and what they decided
are in ``benchmarks/results/ablation/kv_recall_design.md``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) not in (7, 8, 9):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    import torch

    from posenc.data.prepare import prepare
    from posenc.evals.stats.intervals import wilson
    from posenc.models.checkpoint import load_model
    from posenc.runtime.atomic import atomic_write_text
    from posenc.tasks.kv_recall import KVSpec, content_copy_accuracy, kv_probe
    from posenc.tasks.recall import score_recall
    from posenc.training.train import TrainConfig, train

    torch.set_num_threads(1)
    out, name = Path(argv[0]), argv[1]
    rows, weight, pairs, steps, lr = int(argv[2]), float(argv[3]), int(argv[4]), int(argv[5]), float(argv[6])
    text_rows = int(argv[7]) if len(argv) >= 8 else 16
    scheme = argv[8] if len(argv) == 9 else "rope"
    spec = KVSpec(pairs=pairs)  # the layout the trainer uses (KVSpec's default)
    t = time.perf_counter()
    summary = train(TrainConfig(out_dir=str(out / name), scheme=scheme, recall_batch=rows, recall_weight=weight,
                                recall_pairs=pairs, steps=steps, lr=lr, recall_task="kv", save_every=0, eval_batches=2,
                                batch_size=text_rows), progress=False)
    res = {"name": name, "scheme": scheme, "rows": rows, "text_rows": text_rows, "weight": weight, "pairs": pairs,
           "steps": steps, "lr": lr, "layout": spec.layout,
           "train_s": round(time.perf_counter() - t, 1), "val_loss": summary["val_loss"], "cells": []}
    model = load_model(out / name).eval()
    test = prepare("gutenberg", "byte").test
    for task in ("kv_recall", "offset"):
        for n, ds in ((64, (8, 32, 60)), (256, (8, 32, 60, 192))):
            for d in ds:
                p = kv_probe(test, task, n, d, 64, 0, spec)
                acc = score_recall(lambda x: model(x, impl="auto"), p, batch_size=64)
                iv = wilson(round(acc * 64), 64)
                res["cells"].append({"task": task, "length": n, "distance": d, "accuracy": acc, "n": 64,
                                     "lo": iv.lo, "hi": iv.hi})
        control = kv_probe(test, task, 64, 32, 256, 0, spec)
        res[f"{task}_content_copy"] = {"accuracy": content_copy_accuracy(control, spec), "n": 256}
    log = out / "kv_recall_design.jsonl"
    old = log.read_text() if log.exists() else ""
    atomic_write_text(log, old + json.dumps(res) + "\n")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
