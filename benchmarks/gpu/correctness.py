"""Correctness on the device: every engine path against the reference, and cached decoding against the full
forward through ``posenc.hf.extend``, in the run's dtype (bf16 on CUDA) and fp32.

Tolerances (``relative_error`` = max |out - ref| / max |ref|, against the float64 reference on the same rounded
inputs): bf16 2^-4 (the fuzz tests' bf16 bound: 8 significant bits; scores and probabilities are rounded before
the value product), fp32 1e-4 (fp32 kernels sum in another order; no TF32: ``allow_tf32`` stays off). Cached
decode against the full forward of a 4-layer model: bf16 logits within 0.08 of their largest magnitude (activations
are rounded to bf16 after every layer, differently on the two paths: the full forward runs flex, a decode step the
pieces) and the same greedy token on at least 7 of 8 steps; fp32 within 2e-3.
"""

from __future__ import annotations

import torch

from benchmarks.gpu.common import Run, relative_error

TOL = {torch.bfloat16: 2.0 ** -4, torch.float32: 1e-4, torch.float64: 1e-10}
DECODE_TOL = {torch.bfloat16: 0.08, torch.float32: 2e-3}
IMPLS = ("auto", "sdpa", "flex", "blockwise", "band", "chunks", "sinks", "toeplitz")
ENGINE_CASES = [("rope", None, {}), ("alibi", None, {}), ("rope", "yarn", {"factor": 4.0}),
                ("rope", "dynamic_yarn", {}), ("rope", "rerope", {"window": 256}),
                ("rope", "leaky_rerope", {"window": 128, "factor": 3.0}),
                ("rope", "selfextend", {"window": 256, "group": 4}), ("rope", "dca", {"chunk": 384, "local": 32}),
                ("rope", "string", {"shift": 300, "local": 64}), ("rope", "streaming_llm", {"window": 256}),
                ("rope", "sliding_window", {"window": 300})]
FP32_SCHEMES = ("alibi", "selfextend", "dca")  # fp32 on auto only: each dtype compiles its own flex kernels
DECODE_METHODS = ("yarn", "selfextend", "rerope", "dca", "string", "streaming_llm", "ntk")


def _scheme(base: str, method: str | None, params: dict, train_len: int):
    from posenc import PositionScheme

    s = PositionScheme.preset(base, train_len=train_len)
    return s if method is None else s.extend(method, **params)


def engine_paths(run: Run) -> None:
    """Each case x shape x dtype: every named impl (or the backend it falls back to) against the reference."""
    from posenc.engine import AttentionParts, run_attention
    from posenc.engine.dispatch import choose_backend, make_call

    dev = run.device
    n = 130 if run.dry_run else 1000
    shapes = [(n, n), (n // 3, n), (3, n), (1, n)]  # full forward, prefill after a cache, decode steps
    dtypes = [run.dtype] + ([torch.float32] if run.dtype != torch.float32 else [])
    B, H, Hk, D = 2, 8, 2, 64
    for base, method, params in ENGINE_CASES:
        label = method or base
        with run.item("correctness", f"engine {label}", need=20) as go:
            if not go:
                continue
            scheme = _scheme(base, method, {k: min(v, n // 2) if isinstance(v, int) else v
                                            for k, v in params.items()}, train_len=n // 4)
            parts64 = AttentionParts(scheme, H, D).to(dev, torch.float64).eval()
            for dtype in dtypes if label in FP32_SCHEMES else dtypes[:1]:
                parts = AttentionParts(scheme, H, D).to(dev, dtype).eval()
                for Nq, Nk in shapes:
                    g = torch.Generator(device=dev).manual_seed(Nq * 7 + Nk)
                    q = torch.randn(B, H, Nq, D, device=dev, generator=g).to(dtype)
                    k, v = (torch.randn(B, Hk, Nk, D, device=dev, generator=g).to(dtype) for _ in range(2))
                    k_pos = torch.arange(Nk, device=dev)[None].expand(B, -1)
                    q_pos = k_pos[:, Nk - Nq:]
                    with torch.no_grad():
                        ref = run_attention(parts64, q.double(), k.double(), v.double(), q_pos, k_pos,
                                            impl="reference")
                        done: dict = {}
                        for impl in _impls(label, Nq, dtype == run.dtype):
                            ran = choose_backend(make_call(parts, q, k, v, q_pos, k_pos), impl)[0].name
                            if ran in done:
                                continue
                            out = run_attention(parts, q, k, v, q_pos, k_pos, impl=impl)
                            err = relative_error(out, ref)
                            done[ran] = err
                            run.add("correctness", "engine", {
                                "scheme": label, "dtype": str(dtype).split(".")[-1], "Nq": Nq, "Nk": Nk,
                                "impl": impl, "ran": ran, "rel_err": err, "tol": TOL[dtype],
                                "pass": err <= TOL[dtype]})


def _impls(label: str, Nq: int, main_dtype: bool) -> tuple[str, ...]:
    """The impls a case runs: all in the main dtype, ``auto`` in the other; compiled flex named only for a run of
    queries and not for a dynamic schedule (a kernel per shape: decode steps and query groups take other routes)."""
    if not main_dtype:
        return ("auto",)
    if Nq < 64 or label.startswith("dynamic"):
        return tuple(i for i in IMPLS if i != "flex")
    return IMPLS


def _tiny_llama(dev, dtype, train_len: int):
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                                   max_position_embeddings=train_len)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(dev, dtype).eval()


def cached_decode(run: Run) -> None:
    """Prefill ``N - 8`` tokens, then 8 single-token steps through transformers' cache, against the logits of
    one full forward, for each main method at 4x the trained length."""
    import posenc.hf
    from posenc.methods import length_defaults

    dev = run.device
    train, N, steps = (64, 256, 8) if run.dry_run else (256, 1024, 8)
    dtypes = [run.dtype] + ([torch.float32] if run.dtype != torch.float32 else [])
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, 1000, (1, N), generator=g).to(dev)
    for method in DECODE_METHODS:
        with run.item("correctness", f"decode {method}", need=15) as go:
            if not go:
                continue
            for dtype in dtypes:
                params = length_defaults(method, train, N, head_dim=32, base=10000.0, hf=True)
                model = posenc.hf.extend(_tiny_llama(dev, dtype, train), method, native=False, **params)
                with torch.no_grad():
                    full = model(ids).logits[0, N - steps:].float()  # [steps, V]
                    cache, logits = model(ids[:, :N - steps], use_cache=True).past_key_values, []
                    for t in range(N - steps, N):  # each step feeds token t: logits at position t
                        out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
                        cache = out.past_key_values
                        logits.append(out.logits[0, -1].float())
                dec = torch.stack(logits)  # [steps, V], positions N-steps .. N-1 as in full
                ref = full
                err = relative_error(dec, ref)
                agree = int((dec.argmax(-1) == ref.argmax(-1)).sum())
                ok = err <= DECODE_TOL[dtype] and (agree >= steps - 1 if dtype == torch.bfloat16 else agree == steps)
                run.add("correctness", "decode", {"method": method, "params": params,
                                                  "dtype": str(dtype).split(".")[-1], "length": N, "steps": steps,
                                                  "rel_err": err,
                                                  "tol": DECODE_TOL[dtype], "greedy_agree": agree, "pass": ok})
                del model
