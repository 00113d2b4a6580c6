"""The engine against its anchors, on the same card in the same run (goals from the issue):

- RoPE application against copy bandwidth (bytes read + written over time, as a fraction of a plain copy's;
  Liger's fused RoPE reaches 93-100 %), beside transformers' eager rotation;
- ALiBi against bias-free causal SDPA (flash) at the same shape: goal <= 1.15x;
- ReRoPE, SelfExtend, DCA and STRING against plain causal flash at 32k (Llama-3-8B attention: 32 query heads,
  8 key heads, head dim 128): goal <= 1.5x;
- a sliding window (4096) at 128k against full causal flash at 128k: goal >= 10x faster;
- a training step (forward + backward of one attention layer) with posenc's attention against the same layer on
  plain SDPA: goal >= 0.9x the speed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.gpu.common import Run, time_fns

REMAPS = ("rerope", "selfextend", "dca", "string")


def _sizes(run: Run) -> dict:
    if run.dry_run:
        return {"H": 4, "Hk": 2, "D": 32, "N": 512, "long": 1024, "window": 64, "train": 128, "dim": 128, "B": 1}
    return {"H": 32, "Hk": 8, "D": 128, "N": 32768, "long": 131072, "window": 4096, "train": 8192, "dim": 2048,
            "B": 1}


def _qkv(run: Run, H: int, Hk: int, N: int, D: int, B: int = 1):
    g = torch.Generator(device=run.device).manual_seed(N + H)
    q = torch.randn(B, H, N, D, device=run.device, dtype=run.dtype, generator=g)
    k, v = (torch.randn(B, Hk, N, D, device=run.device, dtype=run.dtype, generator=g) for _ in range(2))
    return q, k, v


def _ran(scheme, q, k, v) -> str:
    from posenc.engine.dispatch import choose_backend, make_call
    from posenc.engine.parts import parts_for

    parts = parts_for(scheme.to_json(), q.shape[1], q.shape[-1], str(q.device))
    with torch.no_grad():
        return choose_backend(make_call(parts, q, k, v), "auto")[0].name


def rope_bandwidth(run: Run) -> None:
    from posenc.parts.frequencies import rope_frequencies
    from posenc.parts.rotary import apply_rope_cos_sin, rope_cos_sin

    s = _sizes(run)
    with run.item("anchors", "rope bandwidth", need=10) as go:
        if not go:
            return
        x = torch.randn(1, s["H"], s["N"], s["D"], device=run.device, dtype=run.dtype)
        inv = rope_frequencies(s["D"], 500000.0).inv_freq.to(run.device, torch.float64)
        cos, sin = rope_cos_sin(torch.arange(s["N"], device=run.device)[None], inv)  # [1,1,N,D/2] fp32
        cos_h, sin_h = (torch.cat([c, c], dim=-1).to(run.dtype) for c in (cos, sin))  # transformers' layout

        def hf_rotate():
            x1, x2 = x[..., : s["D"] // 2], x[..., s["D"] // 2:]
            return x * cos_h + torch.cat((-x2, x1), dim=-1) * sin_h

        y = torch.empty_like(x)
        t = time_fns({"posenc": lambda: apply_rope_cos_sin(x, cos, sin), "transformers_eager": hf_rotate,
                      "copy": lambda: y.copy_(x)}, run.device, reps=10)
        nbytes = 2 * x.numel() * x.element_size()
        run.put("anchors", "rope", {
            "shape": list(x.shape), "dtype": run.data["dtype"],
            "ms": {k: round(v * 1e3, 4) for k, v in t.items()},
            "GBps": {k: round(nbytes / v / 1e9, 1) for k, v in t.items()},
            "fraction_of_copy": {k: round(t["copy"] / v, 3) for k, v in t.items() if k != "copy"}})


def alibi(run: Run) -> None:
    from posenc import PositionScheme, attention

    s = _sizes(run)
    with run.item("anchors", "alibi", need=30) as go:
        if not go:
            return
        q, k, v = _qkv(run, s["H"], s["H"], s["N"], s["D"])
        scheme = PositionScheme.preset("alibi", train_len=s["train"])
        with torch.no_grad():
            t = time_fns({"posenc_alibi": lambda: attention(q, k, v, scheme),
                          "sdpa_causal_no_bias": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)},
                         run.device, reps=5)
        run.put("anchors", "alibi", {"shape": list(q.shape), "ran": _ran(scheme, q, k, v),
                                     "ms": {k: round(v * 1e3, 3) for k, v in t.items()},
                                     "ratio": round(t["posenc_alibi"] / t["sdpa_causal_no_bias"], 3),
                                     "goal": "<= 1.15"})


def remaps(run: Run) -> None:
    from posenc import PositionScheme, attention
    from posenc.methods import length_defaults

    s = _sizes(run)
    q, k, v = _qkv(run, s["H"], s["Hk"], s["N"], s["D"])
    base = PositionScheme.preset("rope", train_len=s["train"], base=500000.0)
    for method in REMAPS:
        with run.item("anchors", f"{method} at {s['N']}", need=30) as go:
            if not go:
                continue
            params = length_defaults(method, s["train"], s["N"], head_dim=s["D"], base=500000.0)
            scheme = base.extend(method, **params)
            with torch.no_grad():
                t = time_fns({"posenc": lambda s_=scheme: attention(q, k, v, s_),
                              "flash_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                   enable_gqa=True),
                              # new position tensors every call: the block masks are built again (a model builds
                              # them once per forward for all its layers)
                              "posenc_with_mask_build": lambda s_=scheme: attention(
                                  q, k, v, s_, q_pos=torch.arange(s["N"], device=run.device),
                                  k_pos=torch.arange(s["N"], device=run.device))},
                             run.device, reps=3)
            run.add("anchors", "remaps", {"method": method, "params": params, "shape_q": list(q.shape),
                                          "shape_kv": list(k.shape), "ran": _ran(scheme, q, k, v),
                                          "ms": {k_: round(v_ * 1e3, 3) for k_, v_ in t.items()},
                                          "ratio": round(t["posenc"] / t["flash_causal"], 3), "goal": "<= 1.5"})


def sliding_window(run: Run) -> None:
    from posenc import PositionScheme, attention

    s = _sizes(run)
    with run.item("anchors", f"sliding window at {s['long']}", need=40) as go:
        if not go:
            return
        q, k, v = _qkv(run, s["H"], s["Hk"], s["long"], s["D"])
        scheme = PositionScheme.preset("rope", train_len=s["train"]).extend("sliding_window", window=s["window"])
        with torch.no_grad():
            t = time_fns({"posenc_window": lambda: attention(q, k, v, scheme),
                          "flash_full_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                    enable_gqa=True)},
                         run.device, reps=3)
        run.put("anchors", "sliding_window", {"shape_q": list(q.shape), "window": s["window"],
                                              "ran": _ran(scheme, q, k, v),
                                              "ms": {k_: round(v_ * 1e3, 3) for k_, v_ in t.items()},
                                              "speedup": round(t["flash_full_causal"] / t["posenc_window"], 2),
                                              "goal": ">= 10"})


class _PlainAttention(torch.nn.Module):
    """The same layer as ``posenc.PositionalAttention`` with RoPE, written as transformers writes it: projections,
    rotate-half RoPE from a cos/sin table, ``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)``."""

    def __init__(self, dim: int, H: int, Hk: int, base: float, n: int):
        super().__init__()
        self.H, self.Hk, self.D = H, Hk, dim // H
        self.q, self.o = torch.nn.Linear(dim, dim, bias=False), torch.nn.Linear(dim, dim, bias=False)
        self.k, self.v = (torch.nn.Linear(dim, Hk * self.D, bias=False) for _ in range(2))
        inv = 1.0 / base ** (torch.arange(0, self.D, 2, dtype=torch.float64) / self.D)
        ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
        emb = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def _rot(self, x):
        c, s = self.cos[: x.shape[2]].to(x.dtype), self.sin[: x.shape[2]].to(x.dtype)
        x1, x2 = x[..., : self.D // 2], x[..., self.D // 2:]
        return x * c + torch.cat((-x2, x1), dim=-1) * s

    def forward(self, x):
        B, N, _ = x.shape
        q = self.q(x).view(B, N, self.H, self.D).transpose(1, 2)
        k = self.k(x).view(B, N, self.Hk, self.D).transpose(1, 2)
        v = self.v(x).view(B, N, self.Hk, self.D).transpose(1, 2)
        out = F.scaled_dot_product_attention(self._rot(q), self._rot(k), v, is_causal=True, enable_gqa=True)
        return self.o(out.transpose(1, 2).reshape(B, N, -1))


def training_step(run: Run) -> None:
    from posenc import PositionalAttention, PositionScheme

    s = _sizes(run)
    with run.item("anchors", "training step", need=20) as go:
        if not go:
            return
        n = 4 * s["train"] // 8 if not run.dry_run else 256
        H, Hk = 16, 4
        scheme = PositionScheme.preset("rope", train_len=n, base=500000.0)
        ours = PositionalAttention(s["dim"], H, scheme, n_kv_heads=Hk).to(run.device, run.dtype)
        plain = _PlainAttention(s["dim"], H, Hk, 500000.0, n).to(run.device, run.dtype)
        x = torch.randn(2, n, s["dim"], device=run.device, dtype=run.dtype, requires_grad=True)

        def step(m):
            def f():
                m.zero_grad(set_to_none=True)
                m(x).float().square().mean().backward()
            return f

        t = time_fns({"posenc": step(ours), "plain_sdpa": step(plain)}, run.device, reps=5, warmup=2)
        run.put("anchors", "training_step", {"batch": 2, "tokens": n, "dim": s["dim"], "heads": [H, Hk],
                                             "ms": {k: round(v * 1e3, 3) for k, v in t.items()},
                                             "speed_vs_plain": round(t["plain_sdpa"] / t["posenc"], 3),
                                             "goal": ">= 0.9"})
