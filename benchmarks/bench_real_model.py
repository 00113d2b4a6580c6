"""Speed on a real model: every method through ``posenc.hf.extend`` against the untouched model's own
transformers SDPA path, prefill at 2k/8k/16k/32k and a 64-token cached decode after each.

    .venv/bin/python -m benchmarks.bench_real_model [--layers 1] [--lengths 2048,8192,16384,32768]
        [--methods yarn,rerope,...] [--repeats 3,3,2,1] [--decode 64] [--out DIR]   (``make perf-real``)

Model: SmolLM2-135M-Instruct (``posenc.hf.source.load_source("smollm2")``: a Llama, GQA 9/3 heads, head_dim 64,
trained at 8192), float32 on CPU, optionally cut to its first ``--layers`` decoder layers (a layer is what the
methods change; embedding and the one-row lm_head, ``logits_to_keep=1``, are the same for every method). One
model object: each measurement ``extend``s it with the method (per-length parameters from
:func:`posenc.methods.length_defaults`) and ``unextend``s it after, so the baseline is the very same
weights on transformers' own ``sdpa`` attention. Within each repeat the baseline and every method run one after
another (interleaved), so load affects them alike; each measurement records ``os.getloadavg()``. Ratios are
per repeat (method / that repeat's baseline), reported as median (min, max).

Measured per cell: prefill seconds, decode tokens/s (``--decode`` greedy steps with the model's cache), the peak
resident memory above the model's own (``VmHWM`` reset before, minus ``VmRSS`` before), and for the baseline
the achieved GFLOP/s of the prefill against a measured fp32 matmul peak (:func:`matmul_peak`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, _status_kb, machine_info, trim_heap, write_json
from posenc.evals.suite.prefill import matmul_gflops

TRAIN_LEN, HEAD_DIM, BASE = 8192, 64, 1e5
LENGTHS = (2048, 8192, 16384, 32768)
REPEATS = (3, 3, 2, 1)
#: (row label, method, fixed parameters, extend keywords): the user's path (transformers' own code for the
#: methods it implements), plus YaRN on posenc's engine and the dynamic schedules with a step
METHODS = (
    ("pi", "pi", {}, {}),
    ("ntk", "ntk", {}, {}),
    ("yarn", "yarn", {}, {}),
    ("yarn@engine", "yarn", {}, {"native": False}),
    ("llama3", "llama3", {}, {}),
    ("dynamic_ntk@step512", "dynamic_ntk", {"step": 512}, {}),
    ("dynamic_yarn@step512", "dynamic_yarn", {"step": 512}, {}),
    ("rerope", "rerope", {}, {}),
    ("selfextend", "selfextend", {}, {}),
    ("dca", "dca", {}, {}),
    ("string", "string", {}, {}),
    ("streaming_llm", "streaming_llm", {}, {}),
    ("lm_infinite", "lm_infinite", {}, {}),
    ("sliding_window", "sliding_window", {}, {}),
)
#: ``--lean``: each row on posenc's engine once more with ``rotated_keys=False`` (label ``<row>@lean``): every
#: decode step rotates every cached key it reads, as before the engine kept rotated keys (posenc.hf.keys)
LEAN_SUFFIX = "@lean"
#: the exact per-token dynamic schedule: prefill past the trained length is one backend call per position per
#: layer (measured only where it is the identity, <= TRAIN_LEN, or with --exact-prefill), decode everywhere
EXACT = ("dynamic_ntk@step1", "dynamic_ntk", {"step": 1}, {})
DECODE_ONLY_PREFILL_STEP = 512


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """Best achieved fp32 GFLOP/s of an ``n x n`` matmul (``2 n^3`` flops) on this machine's CPU, now (the suite's
    per-cell probe, :func:`posenc.evals.suite.prefill.matmul_gflops`, at this size)."""
    return matmul_gflops("cpu", n, repeats)


def forward_flops(cfg, n: int, layers: int) -> float:
    """Matmul flops of a causal prefill of ``n`` tokens through ``layers`` Llama layers: projections
    ``2 n d (H D + 2 Hk D) + 2 n H D d``, MLP ``2 n 3 d f``, attention ``2 x 2 H D n^2 / 2`` (causal half)."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    H, Hk = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or d // H
    per = 2 * n * d * (H * D + 2 * Hk * D) + 2 * n * H * D * d + 2 * n * 3 * d * f + 2 * H * D * n * n
    return float(per * layers + 2 * d * cfg.vocab_size)


def load_model(layers: int | None):
    """SmolLM2-135M-Instruct in float32, cut to its first ``layers`` decoder layers (None: all 30)."""
    from posenc.hf.source import load_source

    model, _ = load_source("smollm2")
    if layers:
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:layers]
    return model.eval()


def synthetic_cache(model, n: int):
    """A cache holding ``n`` tokens of random keys and values in every layer (seed 0): decode timing depends on
    the cache's size, not its contents, so a long context's decode is timed without its prefill."""
    from transformers import DynamicCache

    cfg = model.config
    Hk = cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=cfg)
    for i in range(len(model.model.layers)):
        cache.update(torch.randn(1, Hk, n, D, generator=g), torch.randn(1, Hk, n, D, generator=g), i)
    return cache


def _reset_peak() -> int:
    """Collect garbage, give the heap's freed memory back (:func:`benchmarks.common.trim_heap`), reset the kernel's
    peak-RSS mark (``clear_refs`` 5) and return the resident KB now."""
    import gc

    gc.collect()
    trim_heap()
    try:
        open("/proc/self/clear_refs", "w").write("5")
    except OSError:
        pass
    return _status_kb("VmRSS")


@torch.no_grad()
def measure_decode(model, n: int, decode: int) -> dict:
    """``decode`` greedy cached steps after a synthetic ``n``-token cache (:func:`synthetic_cache`) and one untimed
    step. The untimed step stands for the prefill the synthetic cache skips: a method that keeps rotated keys
    (:mod:`posenc.hf.keys`) rotates the whole cache once there, as a real prefill would have (every row takes it,
    the untouched model included); the peak memory counts from before it."""

    cache = synthetic_cache(model, n)
    rss0 = _reset_peak()
    tok = torch.zeros(1, 1, dtype=torch.long)
    model(input_ids=tok, past_key_values=cache, use_cache=True)
    t0 = time.perf_counter()
    for _ in range(decode):
        out = model(input_ids=tok, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
    dec = time.perf_counter() - t0
    return {"prefill_s": None, "decode_tok_s": decode / dec, "prefill_peak_mb": None,
            "peak_mb": (_status_kb("VmHWM") - rss0) / 1024, "rotated_keys_mb": _rotated_keys_mb(model),
            "loadavg": list(os.getloadavg()), "cache": "synthetic"}


def _rotated_keys_mb(model) -> float:
    """MB the engine's rotated keys hold after the decode (:mod:`posenc.hf.keys`; 0 for the native rows, the
    untouched model and the lean form)."""
    from posenc.hf.keys import stored_bytes

    return stored_bytes(model) / 2 ** 20


@torch.no_grad()
def measure(model, n: int, decode: int, switch=None) -> dict:
    """One prefill of ``n`` random tokens (seed 0) and ``decode`` greedy cached steps: seconds, tokens/s, peak
    extra RSS (MB) and the load average when it ran. ``switch``: called between prefill and decode (the exact
    dynamic schedule decodes after a prefill by the stepped one: posenc's cache holds un-rotated keys, the
    same for every schedule)."""

    from transformers import DynamicCache

    ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    rss0 = _reset_peak()
    cache = DynamicCache(config=model.config)
    t0 = time.perf_counter()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    prefill = time.perf_counter() - t0
    peak_prefill = _status_kb("VmHWM")
    tok = out.logits[:, -1].argmax(-1, keepdim=True)
    if switch is not None:
        switch()
    t0 = time.perf_counter()
    for _ in range(decode):
        out = model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
    dec = time.perf_counter() - t0
    peak = _status_kb("VmHWM")
    return {"prefill_s": prefill, "decode_tok_s": decode / dec if decode else None,
            "prefill_peak_mb": (peak_prefill - rss0) / 1024, "peak_mb": (peak - rss0) / 1024,
            "rotated_keys_mb": _rotated_keys_mb(model), "loadavg": list(os.getloadavg())}


def run_one(model, row, n: int, decode: int, decode_only: bool = False, synthetic: bool = False) -> dict:
    """``measure`` with the row's method applied (None: the untouched model), undone after. ``decode_only``:
    the prefill runs the dynamic schedule with a step (its time is not recorded), the decode the row's own."""
    from posenc.hf import extend, unextend
    from posenc.methods import length_defaults

    if row is None:
        return measure_decode(model, n, decode) if synthetic else measure(model, n, decode)
    label, method, fixed, kw = row
    params = {**length_defaults(method, TRAIN_LEN, n, head_dim=HEAD_DIM, base=BASE), **fixed}
    switch = None
    if synthetic:
        extend(model, method, **kw, **params)
        try:
            res = measure_decode(model, n, decode)
        finally:
            unextend(model)
        return {**res, "params": params, **({"extend": kw} if kw else {})}
    if decode_only:  # prefill by the stepped schedule, then the row's own for the decode steps

        def switch():
            unextend(model)
            extend(model, method, **kw, **params)

        extend(model, method, **kw, **{**params, "step": DECODE_ONLY_PREFILL_STEP})
    else:
        extend(model, method, **kw, **params)
    try:
        res = measure(model, n, decode, switch)
    finally:
        unextend(model)
    if decode_only:
        res = {**res, "prefill_s": None, "prefill_by": {"step": DECODE_ONLY_PREFILL_STEP}}
    return {**res, "params": params, **({"extend": kw} if kw else {})}


def _stats(xs: list) -> dict | None:
    xs = [x for x in xs if x is not None]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else None


def summarize(samples: dict, base: list) -> dict:
    """Per row: prefill seconds, decode tokens/s and peak MB (median/min/max), and their ratios to the same
    repeat's baseline (prefill time and memory: method / baseline; decode: method tok/s / baseline tok/s)."""
    out = {}
    for label, runs in samples.items():
        pairs = [(r, base[i]) for i, r in enumerate(runs) if r is not None]
        timed = [(r, b) for r, b in pairs if r["prefill_s"] is not None]
        out[label] = {
            "prefill_s": _stats([r["prefill_s"] for r, _ in timed]),
            "decode_tok_s": _stats([r["decode_tok_s"] for r, _ in pairs]),
            "peak_mb": _stats([r["peak_mb"] for r, _ in pairs]),
            "prefill_ratio": _stats([r["prefill_s"] / b["prefill_s"] for r, b in timed]),
            "decode_ratio": _stats([r["decode_tok_s"] / b["decode_tok_s"] for r, b in pairs
                                    if r["decode_tok_s"] and b["decode_tok_s"]]),
            "peak_ratio": _stats([r["peak_mb"] / b["peak_mb"] for r, b in pairs if b["peak_mb"] > 0]),
        }
    return out


def missing_rows(prior: dict | None, rows) -> list:
    """The rows of ``rows`` that a stopped run's length result ``prior`` holds no measurement of (all of them when
    there is none)."""
    if prior is None:
        return list(rows)
    return [row for row in rows if not any(prior["runs"].get(row[0]) or [])]


def bench_length(model, n: int, repeats: int, rows, decode: int, exact_prefill: bool, log,
                 synthetic: bool = False, progress=None, prior: dict | None = None) -> dict:
    """Interleaved repeats at ``n`` tokens after one unrecorded warm-up run: per repeat the baseline, then every
    row (in an order rotated by the repeat, so no row always runs last). ``progress``: called with the length's
    result so far after every measurement (a whole-model run at 32k takes over an hour: a stopped run keeps
    what it measured). ``prior``: this length's result from a stopped run (``--resume``): its measurements are
    kept, and one more repeat measures the baseline again and only the rows it lacks (the others hold None in
    that repeat), so every ratio still pairs a row with the baseline of its own sitting."""
    base_runs: list = list(prior["untouched"]) if prior else []
    samples: dict = {row[0]: list((prior or {}).get("runs", {}).get(row[0]) or []) for row in rows}
    todo = missing_rows(prior, rows)
    if prior is not None:
        repeats = len(base_runs) + 1 if todo else len(base_runs)

    def so_far() -> dict:
        return {"tokens": n, "repeats": repeats, "untouched": base_runs, "runs": samples,
                "summary": summarize(samples, base_runs)}

    if len(base_runs) >= repeats:
        return so_far()
    run_one(model, None, n, min(decode, 2), synthetic=synthetic)  # unrecorded: one-time allocations paid here,
    #                                                               not in the first recorded peak (the baseline's)
    for rep in range(len(base_runs), repeats):
        base_runs.append(run_one(model, None, n, decode, synthetic=synthetic))
        log(f"  {n} rep {rep} untouched: {base_runs[-1]['prefill_s'] or 0:.2f}s, "
            f"{base_runs[-1]['decode_tok_s'] or 0:.1f} tok/s")
        order = todo[rep % len(todo):] + todo[:rep % len(todo)]
        for label in samples:  # rows not measured in this repeat hold None at its index
            samples[label] += [None] * (rep - len(samples[label]))
        for row in order:
            decode_only = row[0] == EXACT[0] and n > TRAIN_LEN and not exact_prefill
            res = run_one(model, row, n, decode, decode_only, synthetic)
            samples[row[0]].append(res)
            log(f"  {n} rep {rep} {row[0]}: {res['prefill_s'] or 0:.2f}s, {res['decode_tok_s'] or 0:.1f} tok/s")
            if progress is not None:
                progress(so_far())
    for label in samples:
        samples[label] += [None] * (len(base_runs) - len(samples[label]))
    return so_far()


def _native(method: str, kw: dict) -> bool:
    """Whether ``extend`` runs the row on transformers' own code (no posenc engine, no rotated keys to keep)."""
    from posenc.methods.registry import lookup

    return bool(lookup(method, hf=True).hf_native) and kw.get("native") is not False


def lean_row(row: tuple):
    """A ``METHODS`` row's lean form (``<label>@lean``, ``rotated_keys=False``), or None for a row on transformers'
    own code (it keeps no rotated keys to drop)."""
    label, method, fixed, kw = row
    return None if _native(method, kw) else (label + LEAN_SUFFIX, method, fixed, {**kw, "rotated_keys": False})


def run(quick: bool = False, n=None, layers: int | None = 1, lengths=None, repeats=None, methods=None,
        decode: int = 64, exact_prefill: bool = False, synthetic: bool = False, log=print, save=None,
        lean: bool = False, resume: dict | None = None) -> dict:
    """The whole grid (``quick``: 2 layers' worth of nothing heavy: 1 layer, 512 and 2048 tokens, 8 decode
    steps, one repeat, three methods). ``resume``: a stopped run's result (same layers, decode steps and mode):
    what it measured is kept and only what it lacks is measured (:func:`bench_length`)."""
    torch.manual_seed(0)
    lengths = list(lengths or ([512, 2048] if quick else LENGTHS))
    if n:
        lengths = [int(n)]
    repeats = list(repeats or ([1] * len(lengths) if quick else REPEATS[:len(lengths)]))
    decode = 8 if quick else decode
    rows = [r for r in METHODS + (EXACT,) if methods is None or r[0] in methods or r[1] in methods]
    if quick and methods is None:
        rows = [r for r in rows if r[0] in ("yarn@engine", "selfextend", "streaming_llm")]
    if lean:
        rows += [r for r in map(lean_row, rows) if r is not None]
    peak = matmul_peak()
    model = load_model(layers)
    cfg = model.config
    n_layers = len(model.model.layers)
    out = {"model": "SmolLM2-135M-Instruct (float32, CPU)", "layers_timed": n_layers, "decode_tokens": decode,
           "mode": "decode after a synthetic cache (no prefill)" if synthetic else "prefill, then decode",
           "matmul_peak_gflops": peak, "loadavg_start": list(os.getloadavg()), "lengths": {}}
    if resume is not None:
        for key in ("layers_timed", "decode_tokens", "mode"):
            if resume.get(key) != out[key]:
                raise ValueError(f"--resume: the stopped run has {key}={resume.get(key)!r}, this one {out[key]!r}")
        sittings = resume.get("sittings") or [{k: resume.get(k) for k in (
            "matmul_peak_gflops", "loadavg_start", "loadavg_end", "wall_s")}]
        out = {**resume, "sittings": sittings, "lengths": dict(resume["lengths"])}
        out["sittings"] = sittings + [{"matmul_peak_gflops": peak, "loadavg_start": list(os.getloadavg())}]
    t0 = time.perf_counter()
    for n_tok, reps in zip(lengths, repeats):
        log(f"[real-model] {n_tok} tokens, {reps} repeat(s), {n_layers} layer(s), load {os.getloadavg()[0]:.1f}")

        def progress(part, n_tok=n_tok):
            out["lengths"][str(n_tok)] = part
            save(_finish(out, t0))

        prior = out["lengths"].get(str(n_tok))  # a stopped run's (--resume), else None
        res = bench_length(model, n_tok, reps, rows, decode, exact_prefill, log, synthetic,
                           progress if save is not None else None, prior)
        new = res["untouched"][len(prior["untouched"]) if prior else 0:]
        if not synthetic and new:  # against this sitting's peak, from this sitting's baseline (else kept as it was)
            best = min(r["prefill_s"] for r in new)
            res["untouched_gflops"] = forward_flops(cfg, n_tok, n_layers) / best / 1e9
            res["untouched_fraction_of_peak"] = res["untouched_gflops"] / peak
        elif prior:
            res.update({k: prior[k] for k in ("untouched_gflops", "untouched_fraction_of_peak") if k in prior})
        out["lengths"][str(n_tok)] = res
        if save is not None:  # what is measured so far, after every length (a long run stopped keeps it)
            save(_finish(out, t0))
    return _finish(out, t0)


def _finish(out: dict, t0: float) -> dict:
    """``out`` with its wall time, end load and flat summary (median ratios) filled in."""
    out["loadavg_end"] = list(os.getloadavg())
    if out.get("sittings"):  # a resumed run: each sitting's own wall time and load, the total over them
        out["sittings"][-1].update(wall_s=time.perf_counter() - t0, loadavg_end=out["loadavg_end"])
        out["wall_s"] = sum(x.get("wall_s") or 0.0 for x in out["sittings"])
    else:
        out["wall_s"] = time.perf_counter() - t0
    out["summary"] = {f"{n_tok}.{label}.{k}": (v or {}).get("median")
                      for n_tok, res in out["lengths"].items() for label, s in res["summary"].items()
                      for k, v in s.items() if k.endswith("ratio")}
    return out


def decode_table(res: dict) -> str:
    """A decode run (``--decode-only``) as a markdown table: per row, at each length, the decode tokens/s over the
    untouched model's (median [min, max] over the repeats; the untouched model's own tokens/s per repeat first),
    then what the ``@lean`` form of the same row gave, and the MB its rotated keys held at the longest length."""
    lengths = list(res["lengths"])
    rows = [label for label in res["lengths"][lengths[0]]["summary"] if not label.endswith(LEAN_SUFFIX)]
    head = ["row"] + [f"{int(n) // 1024}k decode / untouched" for n in lengths] + \
        [f"{int(lengths[-1]) // 1024}k rotated keys MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = [sorted(r["decode_tok_s"] for r in res["lengths"][n]["untouched"]) for n in lengths]
    lines.append("| untouched (tok/s, each repeat) | " + " | ".join(", ".join(f"{x:.2f}" for x in b) for b in base)
                 + " | - |")

    def ratio(n, label):
        r = res["lengths"][n]["summary"].get(label, {}).get("decode_ratio")
        if not r:
            return None
        return f"{r['median']:.2f}" + (f" [{r['min']:.2f}, {r['max']:.2f}]" if r["n"] > 1 else "")

    for label in rows:
        cells = []
        for n in lengths:
            own, lean = ratio(n, label), ratio(n, label + LEAN_SUFFIX)
            cells.append((own or "-") + (f" (lean {lean})" if lean else ""))
        runs = res["lengths"][lengths[-1]]["runs"].get(label) or []
        mb = [r.get("rotated_keys_mb") for r in runs if r and r.get("rotated_keys_mb") is not None]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {statistics.median(mb):.0f} |" if mb else
                     f"| {label} | " + " | ".join(cells) + " | - |")
    return "\n".join(lines)


def _cell(stat: dict | None) -> str:
    """A ratio's median, with [min, max] when it has more than one repeat ("-": not measured)."""
    if not stat:
        return "-"
    return f"{stat['median']:.2f}" + (f" [{stat['min']:.2f}, {stat['max']:.2f}]" if stat["n"] > 1 else "")


def run_table(res: dict) -> str:
    """A prefill-and-decode run as a markdown table: per row the prefill time over the untouched model's at each
    length, the decode speed over its (tokens/s ratio: above 1 is faster), and the peak memory over its at the
    longest length (median [min, max] over the repeats); the untouched model's own seconds and tokens/s first."""
    lengths = list(res["lengths"])
    k = [f"{int(n) // 1024}k" for n in lengths]
    head = (["row"] + [f"prefill {x}" for x in k] + [f"decode {x}" for x in k]
            + [f"peak memory {k[-1]}", f"rotated keys MB {k[-1]}"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = [res["lengths"][n]["untouched"] for n in lengths]
    lines.append("| untouched (s, tok/s, MB) | "
                 + " | ".join(", ".join(f"{r['prefill_s']:.1f} s" for r in b) for b in base) + " | "
                 + " | ".join(", ".join(f"{r['decode_tok_s']:.2f}" for r in b) for b in base) + " | "
                 + ", ".join(f"{r['peak_mb']:.0f} MB" for r in base[-1]) + " | - |")
    rows = list(dict.fromkeys(label for n in lengths for label in res["lengths"][n]["summary"]))
    for label in rows:
        s = [res["lengths"][n]["summary"].get(label) or {} for n in lengths]
        runs = [r for r in res["lengths"][lengths[-1]]["runs"].get(label) or [] if r]
        mb = [r["rotated_keys_mb"] for r in runs if r.get("rotated_keys_mb") is not None]
        lines.append(f"| {label} | " + " | ".join(_cell(x.get("prefill_ratio")) for x in s) + " | "
                     + " | ".join(_cell(x.get("decode_ratio")) for x in s) + " | " + _cell(s[-1].get("peak_ratio"))
                     + " | " + (f"{statistics.median(mb):.0f}" if mb else "-") + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.bench_real_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--layers", type=int, default=1, help="time the first k decoder layers (0: all 30)")
    p.add_argument("--lengths", default=None, help="comma-separated token counts (default 2048,8192,16384,32768)")
    p.add_argument("--repeats", default=None, help="comma-separated repeats per length (default 3,3,2,1)")
    p.add_argument("--methods", default=None, help="comma-separated row labels or method names (default all)")
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--decode-only", action="store_true",
                   help="time decode steps after a synthetic cache of each length (no prefill)")
    p.add_argument("--exact-prefill", action="store_true", help="also time dynamic_ntk step=1 prefill past 8192")
    p.add_argument("--table", metavar="JSON", help="print the table of a finished run and exit (a --decode-only run: "
                                                   "its decode table)")
    p.add_argument("--lean", action="store_true",
                   help="also run each engine row with rotated_keys=False (label <row>@lean)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="bench_real_model", help="JSON file name (without .json) under --out")
    p.add_argument("--resume", action="store_true",
                   help="keep what the stopped run at --out/--name measured and measure only what it lacks")
    a = p.parse_args(argv)
    if a.table:  # a --decode-only run has no prefill to show
        res = json.loads(open(a.table, encoding="utf-8").read())
        print(decode_table(res) if res.get("mode", "").startswith("decode") else run_table(res))
        return 0
    ints = (lambda s: [int(x) for x in s.split(",")] if s else None)
    resume = None
    if a.resume:
        path = Path(a.out) / f"{a.name}.json"
        if not path.exists():
            p.error(f"--resume: no stopped run at {path} (--out, --name)")
        resume = json.loads(path.read_text(encoding="utf-8"))
    res = run(quick=a.quick, layers=a.layers or None, lengths=ints(a.lengths), repeats=ints(a.repeats),
              methods=a.methods.split(",") if a.methods else None, decode=a.decode, exact_prefill=a.exact_prefill,
              synthetic=a.decode_only, save=lambda r: write_json(a.name, r, a.out), lean=a.lean, resume=resume)
    path = write_json(a.name, res, a.out)
    print(json.dumps({"machine": machine_info(), "summary": res["summary"]}, indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
