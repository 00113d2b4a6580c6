"""RoPE application: q and k ``[1, 32, N, 128]`` fp32 at positions 0..N-1 through posenc's public API, vs
Hugging Face's ``apply_rotary_pos_emb``, ``rotary-embedding-torch`` and a plain copy of the same bytes
(the memory-bandwidth limit). Ratios: ``hf / posenc`` (goal >= 3) and the fraction of copy bandwidth
(goal >= 0.5), each against the copy that does the same memory work:

- out-of-place ``apply_rope`` (allocates its output) against ``clone()`` (allocates too, so both pay the
  page faults of fresh memory);
- in-place ``apply_rope_`` against ``copy_()`` into an existing buffer (neither allocates).
"""

from __future__ import annotations

import torch

from benchmarks.common import cli, time_peers
from posenc.parts.frequencies import rope_frequencies
from posenc.parts.rotary import _cached_cos_sin, _rotate_torch, apply_rope, apply_rope_, rope_kernel


def run(quick: bool = False, n: int | None = None) -> dict:
    N = n or (256 if quick else 4096)
    H, D = (4, 64) if quick else (32, 128)
    repeats = 3 if quick else 15
    torch.manual_seed(0)
    q, k = torch.randn(1, H, N, D), torch.randn(1, H, N, D)
    pos = torch.arange(N)
    inv = rope_frequencies(D).inv_freq  # float32 [D/2]
    kernel = rope_kernel() is not None  # compile (once) before timing
    qi, ki = q.clone(), k.clone()
    qo, ko = q.clone(), k.clone()  # existing, already faulted-in destinations for copy_()

    def posenc_api():
        return apply_rope(q, pos, inv), apply_rope(k, pos, inv)

    def posenc_inplace():  # rotates the same buffers over and over: only the speed matters here
        return apply_rope_(qi, pos, inv), apply_rope_(ki, pos, inv)

    def posenc_pure():  # the PyTorch fallback (no extension), same cached cos/sin
        c, s = _cached_cos_sin(pos[None], inv)
        return _rotate_torch(q, c, s, "half", D), _rotate_torch(k, c, s, "half", D)

    def copy_clone():  # the out-of-place peer: fresh output memory
        return q.clone(), k.clone()

    def copy_into():  # the in-place peer: the same bytes read and written, no allocation
        return qo.copy_(q), ko.copy_(k)

    fns = {"posenc_apply_rope": posenc_api, "posenc_apply_rope_inplace": posenc_inplace,
           "posenc_pure_torch": posenc_pure, "copy_clone": copy_clone, "copy_into": copy_into}
    notes = {}
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        emb = torch.cat((pos[:, None].float() * inv[None], pos[:, None].float() * inv[None]), dim=-1)  # [N, D]
        cos, sin = emb.cos()[None], emb.sin()[None]  # [1, N, D], as LlamaRotaryEmbedding returns them
        fns["hf_apply_rotary_pos_emb"] = lambda: apply_rotary_pos_emb(q, k, cos, sin)

        def hf_with_cos_sin():
            e = torch.cat((pos[:, None].float() * inv[None],) * 2, dim=-1)
            return apply_rotary_pos_emb(q, k, e.cos()[None], e.sin()[None])

        fns["hf_incl_cos_sin"] = hf_with_cos_sin
    except ImportError as exc:
        notes["hf"] = f"skipped: {exc}"
    try:
        from rotary_embedding_torch import RotaryEmbedding

        ret = RotaryEmbedding(dim=D)
        fns["rotary_embedding_torch"] = lambda: (ret.rotate_queries_or_keys(q), ret.rotate_queries_or_keys(k))
    except ImportError as exc:
        notes["rotary_embedding_torch"] = f"skipped: {exc}"
    with torch.no_grad():
        t = time_peers(fns, repeats=repeats)
    bytes_moved = 2 * 2 * q.numel() * 4  # q and k: read + write
    med = {k_: v["median_ms"] for k_, v in t.items()}
    base = med["posenc_apply_rope"]
    inplace = med["posenc_apply_rope_inplace"]
    summary = {"shape": [1, H, N, D], "kernel": kernel, "posenc_ms": base, "posenc_inplace_ms": inplace,
               "clone_GBps": bytes_moved / med["copy_clone"] / 1e6, "posenc_GBps": bytes_moved / base / 1e6,
               "copy_into_GBps": bytes_moved / med["copy_into"] / 1e6,
               "posenc_inplace_GBps": bytes_moved / inplace / 1e6,
               "fraction_of_copy_bandwidth": med["copy_clone"] / base,  # apply_rope vs clone()
               "inplace_fraction_of_copy_bandwidth": med["copy_into"] / inplace,  # apply_rope_ vs copy_()
               "speedup_vs_pure_torch": med["posenc_pure_torch"] / base}
    if "hf_apply_rotary_pos_emb" in med:
        summary["speedup_vs_hf"] = med["hf_apply_rotary_pos_emb"] / base
        summary["speedup_vs_hf_incl_cos_sin"] = med["hf_incl_cos_sin"] / base
    if "rotary_embedding_torch" in med:
        summary["speedup_vs_rotary_embedding_torch"] = med["rotary_embedding_torch"] / base
    summary["goals"] = {"speedup_vs_hf>=3": summary.get("speedup_vs_hf", 0) >= 3,
                        "fraction_of_copy_bandwidth>=0.5": summary["fraction_of_copy_bandwidth"] >= 0.5}
    return {"config": {"N": N, "H": H, "D": D, "repeats": repeats, "quick": quick,
                       "timed": "q and k together, per call",
                       "copy_peers": "apply_rope vs q.clone() (both allocate); apply_rope_ vs buf.copy_(q) "
                                     "into an existing buffer (neither allocates)"},
            "timings": t, "summary": summary, "notes": notes}


if __name__ == "__main__":
    raise SystemExit(cli("bench_rope", run))
