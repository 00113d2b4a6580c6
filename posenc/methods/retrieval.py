"""Methods that choose keys by content or by head: InfLLM-style block retrieval and DuoAttention's streaming/retrieval
heads (:mod:`posenc.parts.retrieval`)."""

from __future__ import annotations

from dataclasses import replace

from posenc.methods.common import need_train_len, positive_or_default, remap, set_remap, window_param
from posenc.methods.records import Method, Param


def _duo(m: Method, scheme, streaming=(), n_sinks=None, window=None):
    """DuoAttention's split: ``streaming`` query heads on every layer, or one list per layer (the scheme becomes
    a layer pattern with one scheme per layer)."""
    L = need_train_len(scheme, m.name)
    if not m.param("streaming").contains(list(streaming) if isinstance(streaming, tuple) else streaming):
        raise ValueError(
            f"duo.streaming must be a list of distinct query-head indices >= 0, or one such list per "
            f"layer, got {streaming!r}"
        )
    params = {
        "n_sinks": m.param("n_sinks").default if n_sinks is None else n_sinks,
        "window": positive_or_default(f"{m.name}.window", window, m.param("window").default_for(L)),
    }
    per_layer = bool(streaming) and all(isinstance(x, (list, tuple)) for x in streaming)
    if not per_layer:
        return set_remap(scheme, m.remap_kind, {"streaming": sorted(streaming), **params})
    layers = tuple(
        replace(set_remap(scheme, m.remap_kind, {"streaming": sorted(h), **params}), name="duo") for h in streaming
    )
    return replace(scheme.__class__(name=scheme.name, embedding=scheme.embedding, train_len=L), layers=layers)


def _retrieval_block(L: int) -> int:
    """InfLLM's block_size 128 at L = 8k: L // 64."""
    return max(1, L // 64)


def _retrieval_default(L, n, head_dim, base):
    b = _retrieval_block(L)
    return {"window": max(1, L // 2), "n_sinks": max(1, L // 64), "block": b, "top_k": max(1, L // 4 // b)}


RECORDS = (
    Method(
        name="retrieval",
        kind="remap",
        description="Xiao et al. 2024 (InfLLM): sinks + local window + the top-k far blocks by "
        "q . mean block key, far keys at distance `window`",
        paper="arXiv:2402.04617",
        apply=remap,
        params=(
            window_param("train_len // 2", lambda L: max(1, L // 2), filled=True, original="n_local"),
            Param(
                name="n_sinks",
                rule="max(1, train_len // 64)",
                minimum=0,
                integer=True,
                filled=True,
                from_train_len=lambda L: max(1, L // 64),
                original="n_init",
            ),
            Param(
                name="block",
                rule="max(1, train_len // 64)",
                minimum=1,
                integer=True,
                filled=True,
                from_train_len=_retrieval_block,
                original="block_size",
            ),
            Param(
                name="top_k",
                rule="train_len // 4 // block",
                minimum=0,
                integer=True,
                filled=True,
                from_train_len=lambda L: max(1, L // 4 // _retrieval_block(L)),
                original="topk",
            ),
            Param(name="per_head", default=False, original="perhead"),
        ),
        sets=("remap",),
        remap_kind="retrieval",
        eval_defaults=_retrieval_default,
        original="thunlp/InfLLM inf_llm/attention/context_manager.py",
    ),
    Method(
        name="duo",
        kind="remap",
        description="Xiao et al. 2024 (DuoAttention): streaming heads see sinks + a window, retrieval heads "
        "everything (heads from posenc.evals.calibrate.calibrate_duo)",
        paper="arXiv:2410.10819",
        apply=_duo,
        params=(
            Param(
                name="streaming",
                default=[],
                heads=True,
                filled=True,
                calibration="duo_streaming",
                original="query heads of the KV heads with full_attention_heads gate below the threshold",
            ),
            Param(name="n_sinks", default=4, minimum=0, integer=True, filled=True, original="sink_size"),
            Param(
                name="window",
                rule="train_len // 4",
                minimum=1,
                integer=True,
                filled=True,
                from_train_len=lambda L: max(1, L // 4),
                original="recent_size (streaming mask d < recent_size)",
            ),
        ),
        sets=("remap",),
        remap_kind="duo",
        original="mit-han-lab/duo-attention duo_attn/patch/streaming_attn.py",
        eval_defaults=lambda L, n, d, b: {"streaming": [0], "n_sinks": 4, "window": max(1, L // 4)},
    ),
)
