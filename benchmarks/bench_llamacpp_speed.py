"""posenc's speed against llama.cpp on the same GGUF (SmolLM2-135M-Instruct Q4_1), same threads, interleaved:
prefill seconds at 2k/8k/16k and decode tokens/s after each, for the untouched model, YaRN and SelfExtend.

    .venv/bin/python -m benchmarks.bench_llamacpp_speed [--lengths 2048,8192,16384] [--decode 32] [--threads 2]
        [--repeats 1] [--force] [--out DIR]
    .venv/bin/python -m benchmarks.bench_llamacpp_speed --table benchmarks/results/llamacpp_speed.json

Engines, one cell each per (method, length), all cells of a length run one after another (interleaved, so load
affects them alike), each with ``os.getloadavg()`` before and after:

- ``posenc``: transformers float32 (the GGUF dequantised, ``posenc.hf.source.load_source``), untouched and YaRN on
  transformers' own code, SelfExtend on posenc's engine (``posenc.hf.extend``); prefill is one forward with the
  cache, decode ``--decode`` greedy steps on it;
- ``llama.cpp`` with flash attention off and on (llama.cpp's CLI default ``-fa auto`` turns it on where the
  backend has it, as the CPU does): the source GGUF for untouched, the GGUF ``posenc extend --format gguf`` writes
  for YaRN, and group attention (``posenc.hf.llamacpp``) for SelfExtend; prefill in chunks of 512, decode one
  token per call.

Parameters per length: YaRN factor ``max(1, n / 8192)``; SelfExtend window 4096 and the suite's group for n
(``posenc.methods.length_defaults``). The run is refused unless the 1-minute load average is at most 0.5 when it
starts (an idle machine), or with ``--force`` (the JSON then says it was not idle). Writes
``benchmarks/results/llamacpp_speed.json`` after every cell; ratios are posenc / llama.cpp per cell.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch

from benchmarks.common import write_json

TRAIN = 8192


def _posenc_cell(model, ids, decode: int) -> dict:
    from posenc.evals.suite.prefill import cache_kwarg, output_cache

    kw = cache_kwarg(model)  # the cache argument's name in this transformers
    t = time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t
        cache, nxt = output_cache(out), out.logits[0, -1].argmax().view(1, 1)
        t = time.perf_counter()
        for _ in range(decode):
            out = model(input_ids=nxt, use_cache=True, **{kw: cache})
            cache, nxt = output_cache(out), out.logits[0, -1].argmax().view(1, 1)
    return {"prefill_s": prefill, "decode_tok_s": decode / (time.perf_counter() - t)}


def _llama_cell(llm, ids, decode: int, group: int | None, window: int | None) -> dict:
    from posenc.hf.llamacpp import GroupAttention, _Batch, _clear, _last_logits, llama_cpp

    lc = llama_cpp()
    mem = _clear(llm)
    state = GroupAttention(group or 1, window or 1)
    batch = _Batch(lc, llm.n_batch)
    try:
        t = time.perf_counter()
        state.feed(llm, batch, mem, list(ids), llm.n_batch)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(decode):
            state.feed(llm, batch, mem, [int(np.argmax(_last_logits(llm)))], 1)
        return {"prefill_s": prefill, "decode_tok_s": decode / (time.perf_counter() - t)}
    finally:
        batch.close()


def run(lengths, decode: int, threads: int, repeats: int, force: bool, out_dir=None) -> dict:
    from posenc.hf.gguf_export import serve_extended
    from posenc.hf.llamacpp import open_gguf
    from posenc.hf.patch import extend
    from posenc.hf.source import bundled_gguf, load_source
    from posenc.methods import length_defaults

    torch.set_num_threads(threads)
    load = os.getloadavg()[0]
    if load > 0.5 and not force:
        raise SystemExit(f"the machine is not idle (1-minute load average {load:.2f}); run again when it is, or "
                         f"--force (the result then says it was not idle)")
    src = bundled_gguf("smollm2")
    _, tok = load_source("smollm2")
    ids_all = tok("the grass is green and the sky is blue. " * 4000)["input_ids"]
    out = {"threads": threads, "decode_tokens": decode, "idle_at_start": load <= 0.5, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for n in lengths:
                ids = ids_all[:n]
                se = length_defaults("selfextend", TRAIN, n)
                factor = max(1.0, n / TRAIN)
                for method in ("none", "yarn", "selfextend"):
                    model, _ = load_source("smollm2")
                    gguf, group, window = src, None, None
                    if method == "yarn" and factor > 1:
                        extend(model, "yarn", factor=factor)
                        gguf = serve_extended(model, src, os.path.join(tmp, f"yarn-{n}.gguf"))["saved"]
                    elif method == "selfextend":
                        extend(model, "selfextend", **se)
                        group, window = se["group"], se["window"]
                    cells = {}
                    l0 = os.getloadavg()
                    cells["posenc"] = _posenc_cell(model, ids, decode)
                    del model
                    for fa in (False, True):
                        llm = open_gguf(gguf, n_ctx=n + decode + 16, threads=threads, flash_attn=fa)
                        cells[f"llama.cpp fa={'on' if fa else 'off'}"] = _llama_cell(llm, ids, decode, group, window)
                        llm.close()
                    ratios = {k: {"prefill": cells["posenc"]["prefill_s"] / v["prefill_s"],
                                  "decode": cells["posenc"]["decode_tok_s"] / v["decode_tok_s"]}
                              for k, v in cells.items() if k != "posenc"}
                    out["rows"].append({"length": n, "method": method, "params": {"yarn": {"factor": factor},
                                        "selfextend": se}.get(method, {}), "cells": cells,
                                        "posenc_over_llama": ratios, "loadavg": [l0, os.getloadavg()]})
                    write_json("llamacpp_speed", out, out_dir)
    return out


def table(res: dict) -> str:
    """The committed run as a markdown table: per (length, method), posenc's prefill seconds and decode tokens/s,
    then llama.cpp's with flash attention off and on, each as posenc / llama.cpp (above 1: posenc takes longer to
    prefill, or decodes faster)."""
    head = ["length", "method", "posenc prefill s", "posenc decode tok/s"]
    engines = [k for k in res["rows"][0]["cells"] if k != "posenc"] if res["rows"] else []
    for e in engines:
        head += [f"{e}: prefill s (posenc / it)", f"{e}: decode tok/s (posenc / it)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res["rows"]:
        p = r["cells"]["posenc"]
        cells = [f"{r['length'] // 1024}k", r["method"], f"{p['prefill_s']:.1f}", f"{p['decode_tok_s']:.1f}"]
        for e in engines:
            c, q = r["cells"][e], r["posenc_over_llama"][e]
            cells += [f"{c['prefill_s']:.1f} ({q['prefill']:.2f}x)", f"{c['decode_tok_s']:.1f} ({q['decode']:.2f}x)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.bench_llamacpp_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="2048,8192,16384")
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--force", action="store_true")
    p.add_argument("--out", default=None, metavar="DIR", help="folder for llamacpp_speed.json (benchmarks/results)")
    p.add_argument("--table", metavar="JSON", help="print the markdown table of a finished run's JSON and exit")
    a = p.parse_args(argv)
    if a.table:
        import json

        print(table(json.loads(open(a.table, encoding="utf-8").read())))
        return 0
    run([int(x) for x in a.lengths.split(",")], a.decode, a.threads, a.repeats, a.force, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
