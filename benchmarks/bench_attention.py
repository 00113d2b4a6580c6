"""Attention, causal, B=1, 4 heads x 64, at several lengths (no_grad, inference).

Peers in one run: bias-free ``F.scaled_dot_product_attention(is_causal=True)`` (the speed limit); posenc's
default (``impl="auto"``) path for ALiBi and Sandwich (distance-only biases: the Toeplitz path,
``posenc/engine/toeplitz.py``) and the compiled FlexAttention path for RoPE and ALiBi; SDPA with a materialised
ALiBi bias (what users do today); ReRoPE through posenc (LSE band merge, and the blockwise branch merge)
vs the bojone-style two-materialised-score-matrices implementation; a sliding window (w=1024) through
posenc's default path and through compiled flex vs full causal attention, and StreamingLLM (4 sinks + 1020
recent keys, two branches: the sinks piece materialised, the window piece on the Toeplitz kernel).
Peak memory of one call per case is measured in a fresh subprocess (VmHWM after minus VmRSS before; see
``benchmarks.common.measure_peak``). ``toeplitz_chunk_ms`` sweeps the Toeplitz path's query chunk.
"""

from __future__ import annotations

import json
import math
import sys

import torch
import torch.nn.functional as F

from benchmarks.common import cli, measure_peak, peak_memory_subprocess, time_peers
from posenc.engine import attention
from posenc.parts.biases import alibi_slopes
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.rotary import apply_rope
from posenc.scheme.core import PositionScheme

H, D = 4, 64
RERROPE_WINDOW, RERROPE_TRAIN = 512, 2048
SLIDING = 1024


def _inputs(N: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, N, D, generator=g) for _ in range(3))


def alibi_bias(N: int) -> torch.Tensor:
    """Materialised causal ALiBi bias ``[1, H, N, N]`` (``-slope * (q - k)``, ``-inf`` above the diagonal)."""
    pos = torch.arange(N)
    d = (pos[:, None] - pos[None, :]).float()  # [N, N]
    bias = -alibi_slopes(H).float()[:, None, None] * d  # [H, N, N]
    return bias.masked_fill(d < 0, float("-inf"))[None]


def rerope_bojone(q, k, v, window: int = RERROPE_WINDOW, base: float = 10000.0):
    """ReRoPE as in Su's reference code: two full score matrices (normal RoPE, and q rotated by ``window``
    against un-rotated k), picked by ``|q - k| < window``, then a causal softmax."""
    N = q.shape[2]
    inv = rope_frequencies(D, base=base).inv_freq
    pos = torch.arange(N)
    scale = 1.0 / math.sqrt(D)
    s1 = apply_rope(q, pos, inv) @ apply_rope(k, pos, inv).transpose(-1, -2) * scale  # [1,H,N,N]
    s2 = apply_rope(q, torch.full_like(pos, window), inv) @ k.transpose(-1, -2) * scale  # [1,H,N,N]
    d = pos[:, None] - pos[None, :]
    s = torch.where(d < window, s1, s2).masked_fill(d < 0, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def schemes():
    return {"rope": PositionScheme.preset("rope"), "alibi": PositionScheme.preset("alibi"),
            "sandwich": PositionScheme.preset("sandwich"),
            "rerope": PositionScheme.preset("rerope", train_len=RERROPE_TRAIN, window=RERROPE_WINDOW),
            "sliding": PositionScheme.preset("sliding_window", train_len=RERROPE_TRAIN, window=SLIDING),
            "streaming": PositionScheme.preset("streaming_llm", train_len=RERROPE_TRAIN, window=SLIDING - 4,
                                               n_sinks=4)}


def case_fns(N: int, q, k, v, materialised: bool):
    sc = schemes()
    fns = {
        "sdpa_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "posenc_flex_rope": lambda: attention(q, k, v, sc["rope"], impl="flex"),
        "posenc_alibi": lambda: attention(q, k, v, sc["alibi"]),  # auto: the Toeplitz path
        "posenc_sandwich": lambda: attention(q, k, v, sc["sandwich"]),
        "posenc_flex_alibi": lambda: attention(q, k, v, sc["alibi"], impl="flex"),
        "posenc_rerope_band": lambda: attention(q, k, v, sc["rerope"], impl="flex"),  # flash per branch + LSE
        "posenc_rerope_blockwise": lambda: attention(q, k, v, sc["rerope"], impl="blockwise"),
        "posenc_sliding1k": lambda: attention(q, k, v, sc["sliding"]),
        "posenc_streaming1k": lambda: attention(q, k, v, sc["streaming"]),  # 4 sinks + 1020 window
        "posenc_flex_sliding1k": lambda: attention(q, k, v, sc["sliding"], impl="flex"),
    }
    if materialised:
        bias = alibi_bias(N)
        fns["sdpa_materialised_alibi"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        fns["rerope_bojone"] = lambda: rerope_bojone(q, k, v)
    return fns


def very_long(N: int) -> dict:
    """The linear-memory paths only, one timed call each (after a warm-up call): causal SDPA, ALiBi,
    ReRoPE and the sliding window at ``N`` tokens. The slow peers (compiled flex, materialised) are left out."""
    q, k, v = _inputs(N)
    sc = schemes()
    fns = {"sdpa_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
           "posenc_alibi": lambda: attention(q, k, v, sc["alibi"]),
           "posenc_rerope_band": lambda: attention(q, k, v, sc["rerope"], impl="flex"),
           "posenc_sliding1k": lambda: attention(q, k, v, sc["sliding"])}
    med = {a: b["median_ms"] for a, b in time_peers(fns, repeats=1).items()}
    sd = med["sdpa_causal"]
    return {"ms": {a: round(b, 1) for a, b in med.items()},
            "alibi_over_sdpa": round(med["posenc_alibi"] / sd, 3),
            "rerope_posenc_over_sdpa": round(med["posenc_rerope_band"] / sd, 3),
            "sdpa_causal_over_sliding1k": round(sd / med["posenc_sliding1k"], 3)}


def chunk_sweep(lengths, chunks=(128, 256, 512, 1024, 2048)) -> dict:
    """Toeplitz-path ALiBi time per query chunk (``posenc.engine.toeplitz.default_chunk`` is set from this)."""
    from posenc.engine.toeplitz import toeplitz_attention
    from posenc.parts.biases import ALiBiBias

    out = {}
    for N in lengths:
        q, k, v = _inputs(N)
        q = q / math.sqrt(D)
        profile = ALiBiBias(H).distance_profile(N)
        fns = {f"C={c}": (lambda c=c, q=q, k=k, v=v, p=profile: toeplitz_attention(q, k, v, p, chunk=c))
               for c in chunks}
        t = time_peers(fns, repeats=3 if N <= 4096 else 1)
        out[f"N={N}"] = {a: round(b["median_ms"], 1) for a, b in t.items()}
    return out


def _mem_case(name: str, N: int) -> dict:
    q, k, v = _inputs(N)
    with torch.no_grad():
        if name == "sdpa_materialised_alibi":  # the bias is part of what this approach costs
            def fn():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=alibi_bias(N))
        else:
            fn = case_fns(N, q, k, v, materialised=name in ("rerope_bojone",))[name]
        if name.startswith("posenc_flex"):  # compile outside the measurement (one-off, not per call)
            attention(*_inputs(N, 1), schemes()[name.split("_")[-1].replace("1k", "")], impl="flex")
        elif name == "posenc_alibi":
            fn = case_fns(N, q, k, v, materialised=False)[name]
        return {"case": name, "N": N, **measure_peak(fn)}


def _mem_available_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def run(quick: bool = False, n: int | None = None) -> dict:
    lengths = [n] if n else ([256] if quick else [1024, 4096, 16384])
    results, summary = {}, {}
    with torch.no_grad():
        # correctness sanity of the peers (not a timing): bojone vs posenc ReRoPE at a small length
        q, k, v = _inputs(min(lengths[0], 1024))
        diff = (rerope_bojone(q, k, v) - attention(q, k, v, schemes()["rerope"], impl="flex")).abs().max()
        summary["rerope_bojone_vs_posenc_maxdiff"] = float(diff)
        for N in lengths:
            q, k, v = _inputs(N)
            materialised = N <= 4096  # 16k: a [1,4,N,N] fp32 matrix is 4 GiB; bojone needs >= 2 of them
            repeats = 3 if quick else (7 if N <= 1024 else 5 if N <= 4096 else 3)
            t = time_peers(case_fns(N, q, k, v, materialised), repeats=repeats)
            med = {a: b["median_ms"] for a, b in t.items()}
            sd = med["sdpa_causal"]
            r = {"rope_flex_over_sdpa": med["posenc_flex_rope"] / sd,
                 "alibi_over_sdpa": med["posenc_alibi"] / sd,
                 "sandwich_over_sdpa": med["posenc_sandwich"] / sd,
                 "alibi_flex_over_sdpa": med["posenc_flex_alibi"] / sd,
                 "rerope_posenc_over_sdpa": med["posenc_rerope_band"] / sd,
                 "rerope_blockwise_over_sdpa": med["posenc_rerope_blockwise"] / sd,
                 "sdpa_causal_over_sliding1k": sd / med["posenc_sliding1k"],
                 "sdpa_causal_over_streaming1k": sd / med["posenc_streaming1k"],
                 "full_causal_flex_over_flex_sliding1k": med["posenc_flex_rope"] / med["posenc_flex_sliding1k"],
                 "sdpa_causal_over_flex_sliding1k": sd / med["posenc_flex_sliding1k"]}
            if materialised:
                r["materialised_alibi_over_posenc_alibi"] = med["sdpa_materialised_alibi"] / med["posenc_alibi"]
                r["materialised_alibi_over_sdpa"] = med["sdpa_materialised_alibi"] / sd
                r["bojone_over_posenc_rerope"] = med["rerope_bojone"] / med["posenc_rerope_band"]
            results[str(N)] = {"timings": t, "ratios": r}
            summary[f"N={N}"] = {"ms": {a: round(b, 2) for a, b in med.items()},
                                 **{a: round(b, 3) for a, b in r.items()}}
        if not quick and n is None:
            summary["toeplitz_chunk_ms"] = chunk_sweep([4096, 16384])
            summary["N=65536"] = very_long(65536)
    # peak memory, one fresh subprocess per case
    mem_cases = [("sdpa_causal", lengths[-1]), ("posenc_alibi", lengths[-1]), ("posenc_flex_alibi", lengths[-1]),
                 ("posenc_rerope_band", lengths[-1]), ("posenc_rerope_blockwise", lengths[-1])]
    if quick:
        mem_cases += [("rerope_bojone", lengths[-1]), ("sdpa_materialised_alibi", lengths[-1])]
    else:
        mem_cases += [("rerope_bojone", 4096), ("rerope_bojone", 8192), ("sdpa_materialised_alibi", 4096),
                      ("posenc_rerope_blockwise", 4096)]
        if _mem_available_gb() >= 21 and lengths[-1] >= 16384:  # bojone at 16k needs ~19 GB
            mem_cases.append(("rerope_bojone", 16384))
    memory = [peak_memory_subprocess("benchmarks.bench_attention", ["--mem", c, N_]) for c, N_ in mem_cases]
    Nm = lengths[-1]
    summary["memory_extra_mb"] = {f"{m.get('case')}@{m.get('N')}": round(m.get("extra_mb", -1), 1) for m in memory}
    # bojone at Nm: two fp32 [1,4,Nm,Nm] score matrices at least (plus where/softmax temporaries)
    summary["bojone_predicted_min_mb_at_" + str(Nm)] = 2 * H * Nm * Nm * 4 / 2**20
    rerope_mem = [m for m in memory if m.get("case") == "posenc_rerope_band" and m.get("N") == Nm]
    if rerope_mem and "extra_mb" in rerope_mem[0]:
        summary["goal_rerope_under_1GB_at_" + str(Nm)] = rerope_mem[0]["extra_mb"] < 1024
    # the goals, judged on this run (every measured length unless the goal names one)
    rs = {N_: results[N_]["ratios"] for N_ in results}
    goals = {"alibi<=1.5x_sdpa": all(r["alibi_over_sdpa"] <= 1.5 for r in rs.values()),
             "rerope<=2x_sdpa": all(r["rerope_posenc_over_sdpa"] <= 2.0 for r in rs.values())}
    if "4096" in rs and "materialised_alibi_over_posenc_alibi" in rs["4096"]:
        goals["alibi>=5x_faster_than_materialised@4096"] = rs["4096"]["materialised_alibi_over_posenc_alibi"] >= 5
    if "16384" in rs:
        goals["sliding1k>=4x_faster_than_causal_sdpa@16384"] = rs["16384"]["sdpa_causal_over_sliding1k"] >= 4
    summary["goals"] = goals
    return {"config": {"lengths": lengths, "H": H, "D": D, "B": 1, "causal": True, "quick": quick,
                       "rerope": {"train_len": RERROPE_TRAIN, "window": RERROPE_WINDOW}, "sliding_window": SLIDING,
                       "skipped": "materialised peers above 4096 tokens (>= 4-8 GiB); 64k not run by default "
                                  "(time budget); pass --n 65536"},
            "results": results, "memory": memory, "summary": summary}


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--mem":
        print(json.dumps(_mem_case(sys.argv[2], int(sys.argv[3]))))
        raise SystemExit(0)
    raise SystemExit(cli("bench_attention", run))
