"""LongRoPE decode across ``original_max_position_embeddings``: posenc's cache of un-rotated keys (the long
factors rotate every cached key at read time, no re-computation) vs plain transformers (Phi-3), whose
``prepare_inputs_for_generation`` drops the cache at the first step past the boundary and re-runs the whole
prefix.

    .venv/bin/python -m benchmarks.bench_longrope [--quick]

Both models: tiny random Phi-3-sized shapes (dim 128, 2 layers, 4 heads, head_dim 32, vocab 256), fp32,
CPU, one torch thread, greedy decoding of ``2 * span`` tokens from a prompt ``span`` tokens short of the
boundary ``L``. Per-step wall times come from a streamer (transformers) and from the loop (posenc); the
step that crosses the boundary is reported on its own. Not the same model (TinyLM vs Phi3ForCausalLM:
different MLP and norms), so compare the *boundary step against each model's own median step* first, and
the absolute tokens/s second. Writes ``benchmarks/results/bench_longrope.json`` and prints a table.
Semantics: transformers' re-run recomputes every layer with the long factors; posenc's step recomputes the
rotations only (exact for the first layer; deeper layers keep the hidden states of the short-factor calls,
see tests/models/test_cache.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import posenc
from posenc.models.cache import KVCache
from posenc.scheme.core import RopeSpec

DIM, LAYERS, HEADS, VOCAB = 128, 2, 4, 256


def _factors(n: int, seed: int = 0) -> tuple[list, list]:
    g = torch.Generator().manual_seed(seed)
    return (1.0 + 0.2 * torch.rand(n, generator=g)).tolist(), (1.0 + 8.0 * torch.rand(n, generator=g)).tolist()


def hf_model(L: int):
    from transformers import Phi3Config, Phi3ForCausalLM

    short, long = _factors(DIM // HEADS // 2)
    cfg = Phi3Config(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=4 * DIM, num_hidden_layers=LAYERS,
                     num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=4 * L,
                     original_max_position_embeddings=L, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     rope_parameters={"rope_type": "longrope", "short_factor": short, "long_factor": long,
                                      "rope_theta": 10000.0, "original_max_position_embeddings": L})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Phi3ForCausalLM(cfg).eval()


def posenc_model(L: int):
    short, long = _factors(DIM // HEADS // 2)
    scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long, "factor": 4.0,
               "original_max_position_embeddings": L}
    scheme = posenc.PositionScheme(name="longrope", rope=RopeSpec(scaling=scaling, dynamic="sequence"), train_len=L)
    torch.manual_seed(0)
    return posenc.TinyLM(posenc.LMConfig(vocab_size=VOCAB, dim=DIM, n_layers=LAYERS, n_heads=HEADS, scheme=scheme,
                                         train_len=L)).eval()


class _Clock:
    """A transformers streamer that records the time of each ``put`` (the first one is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


@torch.no_grad()
def run_hf(L: int, span: int) -> list[float]:
    model = hf_model(L)
    ids = torch.randint(3, VOCAB, (1, L - span), generator=torch.Generator().manual_seed(1))
    clock = _Clock()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2 * span, min_new_tokens=2 * span,
                         do_sample=False, streamer=clock)
    assert out.shape[1] == L + span
    stamps = [t0] + clock.times[1:]  # prompt put, then one put per new token
    return [b - a for a, b in zip(stamps, stamps[1:])]  # step i produced token at position L - span + i


@torch.no_grad()
def run_posenc(L: int, span: int) -> list[float]:
    model = posenc_model(L)
    ids = torch.randint(3, VOCAB, (1, L - span), generator=torch.Generator().manual_seed(1))
    cache = KVCache.for_model(model, 1)
    times = []
    t0 = time.perf_counter()
    tok = model(ids, cache=cache)[:, -1].argmax(-1, keepdim=True)
    times.append(time.perf_counter() - t0)
    for _ in range(2 * span - 1):
        t0 = time.perf_counter()
        tok = model(tok, cache=cache)[:, -1].argmax(-1, keepdim=True)
        times.append(time.perf_counter() - t0)
    return times


def summarise(steps: list[float], span: int) -> dict:
    """``steps[0]`` is the prefill of ``L - span`` tokens; step i >= 1 makes the sequence ``L - span + i`` tokens
    long, so the first step past the boundary (``L + 1`` tokens: long factors; transformers' re-run) is
    step ``span + 1``."""
    decode = steps[1:]
    cross = steps[span + 1]
    others = decode[:span] + decode[span + 1:]
    med = statistics.median(others)
    return {"prefill_ms": steps[0] * 1e3, "decode_tokens_per_s": len(decode) / sum(decode),
            "median_step_ms": med * 1e3, "boundary_step_ms": cross * 1e3, "boundary_over_median": cross / med}


def run(quick: bool = False) -> dict:
    torch.set_num_threads(1)
    L, span = (256, 16) if quick else (2048, 32)
    res = {"config": {"L": L, "span": span, "dim": DIM, "layers": LAYERS, "heads": HEADS, "threads": 1}}
    run_hf(L, 2), run_posenc(L, 2)  # warm-up: one-time costs (posenc's RoPE kernel load, lazy inits) not timed
    res["transformers_phi3"] = summarise(run_hf(L, span), span)
    res["posenc_tinylm"] = summarise(run_posenc(L, span), span)
    return res


def table(res: dict) -> str:
    rows = ["| model | decode tok/s (2 x span steps) | median step ms | boundary step ms | boundary / median |",
            "| --- | --- | --- | --- | --- |"]
    for name in ("transformers_phi3", "posenc_tinylm"):
        r = res[name]
        rows.append(f"| {name} | {r['decode_tokens_per_s']:.1f} | {r['median_step_ms']:.2f} | "
                    f"{r['boundary_step_ms']:.2f} | {r['boundary_over_median']:.1f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    from benchmarks.common import write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="L = 256 instead of 2048")
    args = ap.parse_args(argv)
    res = run(args.quick)
    write_json("bench_longrope", res)
    print(f"L = {res['config']['L']}, span = {res['config']['span']}")
    print(table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
