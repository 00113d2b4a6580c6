"""InfLLM-style block retrieval, one attention call of SmolLM2-135M's shape (B=1, 9 query heads on 3 key/value
heads, head dim 64), no_grad, with the suite's retrieval defaults for a model trained at 8192 tokens (local window
4096, 128 sinks, blocks of 128, top 16 blocks).

Peers in one run, interleaved: causal SDPA over every key (what the untouched model's attention pays: the fused
kernel, no retrieval), posenc's ``retrieved`` backend (``impl="auto"`` picks it: the near band on the fused
kernel, the far piece per query tile over the keys the tile retrieved) and posenc's ``blockwise`` backend (a
materialised score tile per query tile against the keys it chose; the path retrieval ran on before
``retrieved`` existed). ``max_abs_diff`` is between the two posenc paths on the same inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import cli, time_peers
from posenc.engine import attention
from posenc.engine.backends import BY_NAME
from posenc.scheme.core import PositionScheme

H, HK, D, TRAIN = 9, 3, 64, 8192


def _inputs(N: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, N, D, generator=g)
    k, v = (torch.randn(1, HK, N, D, generator=g) for _ in range(2))
    return q, k, v


def _peers(q, k, v, scheme) -> dict:
    return {
        "sdpa_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        "retrieval_retrieved": lambda: attention(q, k, v, scheme, impl="retrieved"),
        "retrieval_blockwise": lambda: attention(q, k, v, scheme, impl="blockwise"),
    }


def run(quick: bool = False, n: int | None = None) -> dict:
    lengths = [n] if n else ([1024] if quick else [8192, 16384])
    train = 256 if quick else TRAIN
    scheme = PositionScheme.preset("retrieval", train_len=train)
    results = {}
    summary = {"scheme": scheme.to_json(), "heads": H, "kv_heads": HK, "head_dim": D,
               "query_tile": BY_NAME["retrieved"].tile}
    with torch.no_grad():
        for N in lengths:
            fns = _peers(*_inputs(N), scheme)
            diff = (fns["retrieval_retrieved"]() - fns["retrieval_blockwise"]()).abs().max()
            t = time_peers(fns, repeats=3 if not quick else 2)
            med = {a: b["median_ms"] for a, b in t.items()}
            r = {"retrieved_over_sdpa": med["retrieval_retrieved"] / med["sdpa_causal"],
                 "blockwise_over_retrieved": med["retrieval_blockwise"] / med["retrieval_retrieved"],
                 "max_abs_diff": float(diff)}
            results[str(N)] = {"timings": t, "ratios": r}
            summary[f"N={N}"] = {"ms": {a: round(b, 1) for a, b in med.items()},
                                 **{a: (round(b, 3) if a != "max_abs_diff" else b) for a, b in r.items()}}
    return {"results": results, "summary": summary}


if __name__ == "__main__":
    raise SystemExit(cli("bench_retrieval", run))
