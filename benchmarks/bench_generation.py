"""Generation benchmark: cached decode vs full recompute at 2k context, and StreamingLLM throughput and
resident memory at 10k and 100k tokens.

    .venv/bin/python -m benchmarks.bench_generation [--quick]   (also part of ``make perf``)

Writes ``benchmarks/results/bench_generation.json`` and prints a Markdown table. CPU, fp32, one torch
thread (the machine is shared; tiny tensors gain nothing from more). Attention path ``impl="auto"``
for both the cached decode and the full recompute (each takes the path a user gets: fused SDPA for RoPE).
The ratio grows with the model: per-token Python overhead dominates a cached step of this 2-layer model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import posenc
from posenc.models.cache import KVCache
from posenc.models.generation import StreamingSession, resident_memory_bytes

RESULTS = Path(__file__).parent / "results"


def tiny_lm(scheme, dim=64, n_layers=2, n_heads=4, vocab=256):
    torch.manual_seed(0)
    return posenc.TinyLM(posenc.LMConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=n_heads,
                                         scheme=scheme, train_len=256)).eval()


@torch.no_grad()
def bench_decode(context: int, n_cached: int, n_recompute: int, impl: str = "auto") -> dict:
    """Tokens/s of greedy decoding after a ``context``-token prompt: with the KV cache (one query per
    step) vs recomputing the whole sequence every step."""
    model = tiny_lm(posenc.PositionScheme.preset("rope", train_len=256))
    ids = torch.randint(0, 256, (1, context))
    cache = KVCache.for_model(model, 1)
    t0 = time.perf_counter()
    logits = model(ids, cache=cache, impl=impl)
    prefill_s = time.perf_counter() - t0
    tok = logits[:, -1].argmax(-1, keepdim=True)
    t0 = time.perf_counter()
    for _ in range(n_cached):
        tok = model(tok, cache=cache, impl=impl)[:, -1].argmax(-1, keepdim=True)
    cached_tps = n_cached / (time.perf_counter() - t0)
    seq = ids
    t0 = time.perf_counter()
    for _ in range(n_recompute):
        nxt = model(seq, impl=impl)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    recompute_tps = n_recompute / (time.perf_counter() - t0)
    return {"context": context, "prefill_s": prefill_s, "cached_tokens_per_s": cached_tps,
            "recompute_tokens_per_s": recompute_tps, "speedup": cached_tps / recompute_tps,
            "cached_steps": n_cached, "recompute_steps": n_recompute, "impl": impl}


@torch.no_grad()
def bench_streaming(totals: list[int], chunk: int, window: int, n_sinks: int, decode_tokens: int) -> list[dict]:
    """StreamingLLM over a random token stream: throughput and RSS after 10k / 100k tokens (one session,
    fed in ``chunk``-token forwards), plus token-by-token decode throughput."""
    scheme = posenc.PositionScheme.preset("streaming_llm", train_len=256, window=window, n_sinks=n_sinks)
    model = tiny_lm(scheme)
    rows = []
    session = StreamingSession(model, chunk=chunk)
    g = torch.Generator().manual_seed(0)
    rss0 = resident_memory_bytes()
    fed, t_total = 0, 0.0
    for total in totals:
        while fed < total:
            n = min(8192, total - fed)
            toks = torch.randint(0, 256, (n,), generator=g)
            t0 = time.perf_counter()
            session.feed(toks)
            t_total += time.perf_counter() - t0
            fed += n
        rows.append({"mode": f"chunk {chunk}", "tokens": total, "tokens_per_s": total / t_total,
                     **_rss(rss0),
                     "cache_slots": session.cache.capacity, "cache_kib": session.cache.nbytes() / 1024,
                     "max_slots_used": session.max_slots})
    step = StreamingSession(model, chunk=1)
    toks = torch.randint(0, 256, (decode_tokens,), generator=g)
    t0 = time.perf_counter()
    step.feed(toks)
    dt = time.perf_counter() - t0
    rows.append({"mode": "token by token", "tokens": decode_tokens, "tokens_per_s": decode_tokens / dt,
                 **_rss(rss0),
                 "cache_slots": step.cache.capacity, "cache_kib": step.cache.nbytes() / 1024,
                 "max_slots_used": step.max_slots})
    return rows


def _rss(rss0: int) -> dict:
    now = resident_memory_bytes()
    return {"rss_mib": now / 2**20, "rss_growth_mib": (now - rss0) / 2**20}


def markdown(res: dict) -> str:
    d = res["decode"]
    lines = ["| decode @ context | cached tok/s | recompute tok/s | speedup |", "|---|---|---|---|",
             f"| {d['context']} | {d['cached_tokens_per_s']:.1f} | {d['recompute_tokens_per_s']:.2f} | "
             f"{d['speedup']:.1f}x |", "",
             f"StreamingLLM (window {res['streaming_config']['window']}, sinks {res['streaming_config']['n_sinks']}, "
             f"dim 64, 2 layers):", "",
             "| mode | tokens | tok/s | RSS MiB | RSS growth MiB | cache slots | cache KiB |",
             "|---|---|---|---|---|---|---|"]
    for r in res["streaming"]:
        lines.append(f"| {r['mode']} | {r['tokens']} | {r['tokens_per_s']:.0f} | {r['rss_mib']:.1f} | "
                     f"{r['rss_growth_mib']:.1f} | {r['cache_slots']} | {r['cache_kib']:.0f} |")
    return "\n".join(lines)


def run(quick: bool = False, n: int | None = None, threads: int = 1) -> dict:
    """Everything above; ``n`` overrides the decode context. Returns config, raw results and a summary
    with the issue's goals (cached decode >= 10x recompute; StreamingLLM flat from 10k to 100k tokens)."""
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        ctx = n or (256 if quick else 2048)
        totals = [1000, 5000] if quick else [10_000, 100_000]
        window, n_sinks, chunk = 256, 4, 64
        decode = bench_decode(ctx, n_cached=64, n_recompute=3 if not quick else 8)
        streaming = bench_streaming(totals, chunk, window, n_sinks, decode_tokens=500 if quick else 2000)
    finally:
        torch.set_num_threads(old_threads)
    short, long = streaming[0], streaming[1]
    summary = {"decode_context": ctx, "cached_decode_over_recompute": round(decode["speedup"], 1),
               f"streaming_tokens_per_s@{short['tokens']}": round(short["tokens_per_s"]),
               f"streaming_tokens_per_s@{long['tokens']}": round(long["tokens_per_s"]),
               "streaming_long_over_short_throughput": round(long["tokens_per_s"] / short["tokens_per_s"], 3),
               "streaming_cache_kib": [round(short["cache_kib"], 1), round(long["cache_kib"], 1)],
               "goals": {"cached_decode>=10x": decode["speedup"] >= 10,
                         "streaming_flat": (long["tokens_per_s"] >= 0.8 * short["tokens_per_s"]
                                            and long["cache_kib"] == short["cache_kib"])}}
    return {"config": {"threads": threads, "quick": quick, "model": "TinyLM dim 64, 2 layers, 4 heads"},
            "decode": decode, "streaming_config": {"window": window, "n_sinks": n_sinks, "chunk": chunk},
            "streaming": streaming, "summary": summary}


def main(argv=None) -> int:
    from benchmarks.common import write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    res = run(quick=args.quick, threads=args.threads)
    path = write_json("bench_generation", res, args.out)
    print(markdown(res))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
