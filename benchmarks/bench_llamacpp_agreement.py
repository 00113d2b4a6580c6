"""Next-token agreement between posenc's transformers path and llama.cpp on the same GGUF: SmolLM2 untouched, YaRN
and linear (factor 2), each written by ``posenc.hf.gguf_export.serve_extended`` and read by llama.cpp with flash
attention off and on; the last 64 positions of the suite's 4k pass-key context (noise haystack, seed 0, then its
query).

    .venv/bin/python -m benchmarks.bench_llamacpp_agreement

posenc dequantises the Q4_1 weights to float32 and multiplies in float32; llama.cpp multiplies the Q4_1 blocks
against activations it quantises to 8 bits and keeps an F16 KV cache. Per cell: top-1 agreement, the largest and
mean |logit gap|, KL(posenc || llama.cpp) mean and max (nats), posenc's top-2 margin where the top tokens differ, and
the smallest margin where they agree; the tolerance of ``tests/hf/test_llamacpp.py`` is set from these. Writes
``benchmarks/results/llamacpp_agreement.json``.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import torch

from benchmarks.common import write_json

LAST = 64
METHODS = (("none", {}), ("yarn", {"factor": 2.0}), ("linear", {"factor": 2.0}))


def _logp(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def cell(ref: np.ndarray, got: np.ndarray) -> dict:
    srt = np.sort(ref, -1)
    margin = srt[:, -1] - srt[:, -2]
    differ = ref.argmax(-1) != got.argmax(-1)
    kl = (np.exp(_logp(ref)) * (_logp(ref) - _logp(got))).sum(-1)
    gap = np.abs(got - ref)
    return {"agree": float((~differ).mean()), "max_abs": float(gap.max()), "mean_abs": float(gap.mean()),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "margins_where_disagree": margin[differ].round(3).tolist(),
            "min_margin_agree": float(margin[~differ].min())}


def main() -> int:
    from posenc.hf.gguf_export import serve_extended
    from posenc.hf.llamacpp import next_token_logits, open_gguf
    from posenc.hf.patch import extend
    from posenc.hf.source import bundled_gguf, load_source
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack

    torch.set_num_threads(2)
    _, tok = load_source("smollm2")
    ctx = build_context(tok, make_haystack("noise", tok), 4096, ("passkey",), seed=0)
    ids = list(ctx.ids) + list(ctx.queries[0].ids)
    out = {"tokens": len(ids), "positions": LAST, "threads": 2, "cells": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for method, params in METHODS:
            model, _ = load_source("smollm2")
            if method != "none":
                extend(model, method, **params)
            path = serve_extended(model, bundled_gguf("smollm2"), os.path.join(tmp, f"{method}.gguf"))["saved"]
            t = time.perf_counter()
            with torch.no_grad():
                ref = model(input_ids=torch.tensor([ids]), logits_to_keep=LAST).logits[0].float().numpy()
            posenc_s = time.perf_counter() - t
            for fa in (False, True):
                llm = open_gguf(path, n_ctx=len(ids) + 16, flash_attn=fa)
                load0, t = os.getloadavg(), time.perf_counter()
                got = next_token_logits(llm, ids, last=LAST)
                out["cells"][f"{method}/flash_attn={fa}"] = {**cell(ref, got), "posenc_s": posenc_s,
                                                             "llama_s": time.perf_counter() - t,
                                                             "loadavg": [load0, os.getloadavg()]}
                llm.close()
                write_json("llamacpp_agreement", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
