"""How far llama.cpp's group attention is from posenc's two-branch SelfExtend, on SmolLM2 (its own Q4_1 GGUF in
llama.cpp; the same file dequantised to float32 in posenc's transformers path).

    .venv/bin/python -m benchmarks.bench_llamacpp_selfextend [--parts logits,passkeys] [--seeds 0,1,2,3]

- ``logits``: the last 64 positions of the suite's 2k pass-key context (noise haystack, seed 0), SelfExtend group 4,
  window 512 (active from position 512): posenc's SelfExtend against llama.cpp's group attention
  (:func:`posenc.hf.llamacpp.selfextend_logits`, chunks of 512 then the last 64), beside the two floors that frame it:
  untouched posenc against untouched llama.cpp (the quantisation gap alone) and posenc's SelfExtend against untouched
  posenc (what the method changes). Each pair: top-1 agreement, mean and max KL(a || b) in nats, mean |logit gap|.
- ``passkeys``: the suite's short-preset pass-key contexts at 16384 (``noise:passkey:4``, seeds 0-3), SelfExtend
  group 4, window 4096 (the committed run's parameters), llama.cpp with flash attention, 2 threads; each answer
  scored as the suite scores it, beside posenc's committed answer (``benchmarks/results/suite-smollm2/cells``);
  ``--stock-div`` measures llama.cpp's own ``llama_memory_seq_div`` instead of posenc's per-position shifts
  (``posenc.hf.llamacpp.GroupAttention``: the stock call turns the grouped keys the wrong way in this llama.cpp).

Writes ``benchmarks/results/llamacpp_selfextend.json`` after every measurement (a stopped run keeps what it did),
with the load average before and after each.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, write_json

GROUP, WINDOW, LAST = 4, 512, 64
OUT = [RESULTS]  # --out
LONG, LONG_WINDOW = 16384, 4096


def _logp(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """Top-1 agreement, KL(a || b) (mean, max, nats) and mean |logit gap| of two ``[positions, vocab]`` arrays."""
    la, lb = _logp(a), _logp(b)
    kl = (np.exp(la) * (la - lb)).sum(-1)
    return {"top1_agree": float((a.argmax(-1) == b.argmax(-1)).mean()), "kl_mean": float(kl.mean()),
            "kl_max": float(kl.max()), "mean_abs_gap": float(np.abs(a - b).mean()), "positions": int(a.shape[0])}


def _posenc_logits(method: str, ids, **params) -> np.ndarray:
    from posenc.hf.patch import extend
    from posenc.hf.source import load_source

    model, _ = load_source("smollm2")
    if method != "none":
        extend(model, method, **params)
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)]), logits_to_keep=LAST).logits[0].float().numpy()


def _llama_group_logits(llm, ids, group: int, window: int) -> np.ndarray:
    """llama.cpp's group attention over ``ids`` with logits for the last ``LAST`` positions (their own chunk)."""
    from posenc.hf.llamacpp import GroupAttention, _Batch, _clear, _last_logits, llama_cpp

    lc = llama_cpp()
    mem = _clear(llm)
    state = GroupAttention(group, window)
    batch = _Batch(lc, llm.n_batch)
    try:
        state.feed(llm, batch, mem, list(ids[:-LAST]), llm.n_batch)
        state.compress(lc, mem)
        batch.decode(llm.ctx, list(ids[-LAST:]), state.n_past, outputs=LAST)
    finally:
        batch.close()
    return np.stack([_last_logits(llm, i) for i in range(LAST)])


def logits_part(out: dict) -> None:
    from posenc.hf.llamacpp import next_token_logits, open_gguf
    from posenc.hf.source import bundled_gguf, load_tokenizer
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack

    tok = load_tokenizer("smollm2")
    ctx = build_context(tok, make_haystack("noise", tok), 2048, ("passkey",), seed=0)
    ids = list(ctx.ids)
    load0 = os.getloadavg()
    t = time.perf_counter()
    p_none = _posenc_logits("none", ids)
    p_se = _posenc_logits("selfextend", ids, group=GROUP, window=WINDOW)
    llm = open_gguf(bundled_gguf("smollm2"), n_ctx=len(ids) + 16)
    l_none = next_token_logits(llm, ids, last=LAST)
    l_se = _llama_group_logits(llm, ids, GROUP, WINDOW)
    out["logits"] = {"length": len(ids), "group": GROUP, "window": WINDOW, "chunk": llm.n_batch,
                     "posenc_none_vs_llama_none": compare(p_none, l_none),
                     "posenc_selfextend_vs_llama_group": compare(p_se, l_se),
                     "posenc_selfextend_vs_posenc_none": compare(p_se, p_none),
                     "llama_group_vs_llama_none": compare(l_se, l_none),
                     "seconds": time.perf_counter() - t, "loadavg": [load0, os.getloadavg()]}
    write_json("llamacpp_selfextend", out, OUT[0])


def _posenc_cells() -> dict[int, dict]:
    cells = {}
    for f in sorted((RESULTS / "suite-smollm2" / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        k = cell["key"]
        if k["method"] == "selfextend" and k["length"] == LONG and k["generators"] == ["passkey"]:
            cells[k["seed"]] = {"params": k["params"], "answer": cell["value"]["answers"][0]["answer"],
                                "correct": cell["value"]["answers"][0]["correct"]}
    return cells


def passkey_part(out: dict, seeds, stock_div: bool = False) -> None:
    from posenc.hf.llamacpp import llama_cpp, open_gguf, selfextend_answer
    from posenc.hf.source import bundled_gguf, load_tokenizer
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack
    from posenc.tasks.score import score

    lc = llama_cpp()
    tok = load_tokenizer("smollm2")
    hay = make_haystack("noise", tok)
    posenc = _posenc_cells()
    llm = open_gguf(bundled_gguf("smollm2"), n_ctx=LONG + 64, flash_attn=True)
    eos = lc.llama_vocab_eos(lc.llama_model_get_vocab(llm.model))
    name = "passkeys_stock_seq_div" if stock_div else "passkeys"
    rows = out.setdefault(name, {"length": LONG, "group": GROUP, "window": LONG_WINDOW, "flash_attn": True,
                                 "threads": 2, "rows": []})["rows"]
    for seed in seeds:
        ctx = build_context(tok, hay, LONG, ("passkey",), seed=seed)
        q = ctx.queries[0]
        load0 = os.getloadavg()
        t = time.perf_counter()
        text = selfextend_answer(llm, ctx.ids, q.ids, GROUP, LONG_WINDOW, max_new_tokens=q.max_new_tokens,
                                 decode=tok.decode, eos=eos, stock_div=stock_div)
        rows.append({"seed": seed, "gold": list(q.golds), "llama_answer": text.strip(),
                     "llama_correct": score(text, q.golds)[0], "posenc": posenc.get(seed),
                     "seconds": time.perf_counter() - t, "loadavg": [load0, os.getloadavg()]})
        write_json("llamacpp_selfextend", out, OUT[0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.bench_llamacpp_selfextend", description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="logits,passkeys")
    p.add_argument("--seeds", default="0,1,2,3")
    p.add_argument("--stock-div", action="store_true", help="llama.cpp's own llama_memory_seq_div (keys turned the "
                   "wrong way in this llama.cpp), recorded as passkeys_stock_seq_div")
    p.add_argument("--out", default=str(RESULTS), metavar="DIR", help="folder of llamacpp_selfextend.json")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    OUT[0] = Path(args.out)
    path = OUT[0] / "llamacpp_selfextend.json"
    kept = ("logits", "passkeys", "passkeys_stock_seq_div")
    out = {k: v for k, v in json.loads(path.read_text()).items() if k in kept} if path.is_file() else {}
    parts = args.parts.split(",")
    if "logits" in parts:
        logits_part(out)
    if "passkeys" in parts:
        out.pop("passkeys_stock_seq_div" if args.stock_div else "passkeys", None)
        passkey_part(out, [int(s) for s in args.seeds.split(",")], args.stock_div)
    print(Path(path).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
