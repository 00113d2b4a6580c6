"""Masks (``kind`` ``mask``): sliding window, LM-Infinite, StreamingLLM, blockwise causal attention and Llama 4's
chunked attention (:mod:`posenc.parts.masks`; LM-Infinite's ceiling and StreamingLLM's re-indexing are remaps of
:mod:`posenc.parts.remap`)."""

from __future__ import annotations

from dataclasses import replace

from posenc.methods.common import need_train_len, positive_or_default, set_remap, window_param
from posenc.methods.records import Method, Param


def _sliding_window(m: Method, scheme, window=None):
    L = need_train_len(scheme, m.name)
    return replace(scheme, mask=replace(scheme.mask, window=positive_or_default(f"{m.name}.window", window, L)))


def _bca(m: Method, scheme, block=None):
    L = need_train_len(scheme, m.name)
    return replace(scheme, mask=replace(scheme.mask, block=positive_or_default(f"{m.name}.block", block, L // 2)))


def _lm_infinite(m: Method, scheme, window=None, n_global=None, ceiling=None):
    L = need_train_len(scheme, m.name)
    n_g = m.param("n_global").default if n_global is None else n_global
    mask = replace(scheme.mask, window=positive_or_default(f"{m.name}.window", window, L), n_sinks=n_g)
    s = replace(scheme, mask=mask)
    if scheme.rope is not None or scheme.bias is not None:
        ceiling = positive_or_default(f"{m.name}.ceiling", ceiling, L)
        s = set_remap(s, m.remap_kind, {"ceiling": ceiling})
    return s


def _streaming_llm(m: Method, scheme, window=None, n_sinks=None):
    L = need_train_len(scheme, m.name)
    sinks = m.param("n_sinks").checked(m.name, n_sinks)  # before train_len - n_sinks is computed from it
    w = positive_or_default(f"{m.name}.window", window, L - sinks)
    s = replace(scheme, mask=replace(scheme.mask, window=w, n_sinks=sinks))
    if scheme.rope is not None or scheme.bias is not None:
        s = set_remap(s, m.remap_kind, {"n_sinks": sinks, "window": w})
    return s


def _chunked_attention(m: Method, scheme, chunk=None):
    L = need_train_len(scheme, m.name)
    return replace(scheme, mask=replace(scheme.mask, chunk=positive_or_default(f"{m.name}.chunk", chunk, L)))


def _streaming_default(L, n, head_dim, base):
    sinks = min(4, L // 2)
    return {"n_sinks": sinks, "window": L - sinks}


RECORDS = (
    Method(
        name="sliding_window",
        kind="mask",
        description="keys within the last `window` positions",
        paper="arXiv:2004.05150",
        apply=_sliding_window,
        params=(window_param("train_len", lambda L: L, original="sliding_window (transformers, Mistral)"),),
        sets=("mask",),
        eval_defaults=lambda L, n, d, b: {"window": L},
    ),
    Method(
        name="lm_infinite",
        kind="mask",
        description="Han et al. 2023: Lambda mask + distance ceiling",
        paper="arXiv:2308.16137",
        apply=_lm_infinite,
        params=(
            window_param("train_len", lambda L: L, original="local_branch"),
            Param(name="n_global", default=10, minimum=0, integer=True, original="global_branch"),
            Param(
                name="ceiling",
                rule="train_len",
                minimum=1,
                integer=True,
                from_train_len=lambda L: L,
                original="limit_distance",
            ),
        ),
        sets=("mask", "remap"),
        remap_kind="ceiling",
        original="Glaciohound/LM-Infinite models/lambda_attention.py",
        eval_defaults=lambda L, n, d, b: {"window": L, "n_global": min(10, L // 2), "ceiling": L},
    ),
    Method(
        name="streaming_llm",
        kind="mask",
        description="Xiao et al. 2023: attention sinks + recent window",
        paper="arXiv:2309.17453",
        apply=_streaming_llm,
        params=(
            window_param(
                "train_len - n_sinks",
                lambda L: L - 4,
                original="recent_size + 1 (recent_size does not count the current token)",
            ),
            Param(name="n_sinks", default=4, minimum=0, integer=True, original="start_size"),
        ),
        sets=("mask", "remap"),
        remap_kind="streaming",
        eval_defaults=_streaming_default,
        original="mit-han-lab/streaming-llm streaming_llm/kv_cache.py",
    ),
    Method(
        name="bca",
        kind="mask",
        description="Sun et al. 2022: blockwise causal attention, block L/2",
        paper="arXiv:2212.10554",
        apply=_bca,
        params=(
            Param(
                name="block",
                rule="train_len // 2",
                minimum=1,
                integer=True,
                from_train_len=lambda L: L // 2,
                original="the paper's block (L/2); no runnable original",
            ),
        ),
        sets=("mask",),
        eval_defaults=lambda L, n, d, b: {"block": max(1, L // 2)},
    ),
    Method(
        name="chunked_attention",
        kind="mask",
        description="Llama 4: a query sees only the keys of its own chunk of `chunk` tokens",
        paper="https://ai.meta.com/blog/llama-4-multimodal-intelligence/",
        apply=_chunked_attention,
        params=(
            Param(
                name="chunk",
                rule="train_len",
                minimum=1,
                integer=True,
                from_train_len=lambda L: L,
                original="attention_chunk_size (transformers Llama4TextConfig)",
            ),
        ),
        sets=("mask",),
        eval_defaults=lambda L, n, d, b: {"chunk": L},
    ),
)
