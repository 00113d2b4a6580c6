"""The long-context suite's presets on the real model posenc installs (SmolLM2-135M-Instruct, trained at 8192).

- ``smollm2``: the short version (``docs/results/smollm2.md``, ~45 minutes on 2 idle cores): the untouched model, YaRN
  (frequencies), SelfExtend (a position remap) and StreamingLLM (a window) at 8k (the trained length, the
  reference) and 16k, one book and four pass-key contexts per cell;
- ``smollm2_full``: every training-free method that applies to a RoPE model, the 2024 ones included (STRING,
  Resonance RoPE, DCA with ChunkLlama's and Qwen2.5-1M's temperatures, InfLLM-style block retrieval, DuoAttention
  with heads calibrated on the model), at 4k, 8k, 16k and 32k: hours; the run is resumable cell by cell and can be
  completed over several sittings. Every cell of ``smollm2`` is a cell of ``smollm2_full`` (same key), so a full run
  holds the short one. Contexts per cell: one book context and four pass-key seeds up to 16k, the aggregation
  context up to 8k, one book and two pass-key contexts at 32k, where a method runs only if its retrieval at 16k
  reached the threshold (a 32k prefill costs about four times a 16k one). Every row is compared with SelfExtend,
  DCA and YaRN query by query at 16k and 32k (paired differences with intervals).
- ``smollm2_tune16k``: the LongRoPE factors ``posenc tune`` found for 16k (the best native candidate; the tune's
  winner, SelfExtend at its per-length defaults, is the suite's own ``selfextend`` row) beside the untouched model,
  YaRN and SelfExtend at 8k and 16k, on ``smollm2_full``'s contexts: run with ``--cells`` pointing at a
  ``smollm2_full`` run's cells, only the tuned rows are computed. Two tuned rows: ``longrope@tune16k`` as
  transformers serves the factors (the set chosen by sequence length, cached keys kept as they were rotated),
  ``longrope@engine16k`` the same factors on posenc's engine (``native=False``: a dynamic schedule recomputed every
  512 positions, whose cached decoding equals the full forward).
- ``smollm2_tune32k``: the same for ``posenc tune`` at 32k, at 8k, 16k and 32k: its winner (NTK with factor 6,
  ``ntk@tune32k``) and its best LongRoPE factors, served by transformers and on posenc's engine, beside the
  untouched model, YaRN and SelfExtend at their per-length defaults (every row runs at 32k: no pruning).
- ``smollm2_paired16k``: the rows that extend at 16k (SelfExtend, DCA, YaRN, STRING, InfLLM-style retrieval,
  Resonance+YaRN, DCA with Qwen2.5-1M's temperature) with 8 more pass keys at 16k (seeds 4-11, so n = 12 with
  ``smollm2_full``'s four), each compared with SelfExtend, DCA and YaRN on the same keys: the preset that says by
  how much one method beats another. Run with ``--cells`` pointing at a ``smollm2_full`` run's cells (only the new
  seeds and the rows' missing cells are computed): ~2 h on 2 idle cores.

Contexts: a book context (Gutenberg prose) holding the multi-key/multi-query needles and ending with a 512-token
target passage (perplexity), pass-key contexts in Landmark's noise haystack (the one retrieval task this 135M
model solves at its trained length: it answers the multi-key needles at about chance even at 4k), and (full, up to
8k) a noise context with the multi-value, variable-tracking and common-word tasks. Method parameters follow the length
(:func:`posenc.evals.suite.spec.method_params`: ``factor = n / 8192``, SelfExtend's group, DCA's chunk 6144 and local
512, the windows at 8192, ...); the dynamic schedules recompute their length every 512 positions (``step``), which
keeps cached decoding equal to the full forward and costs the engine one call per 512 queries instead of one per
query.
"""

from __future__ import annotations

from posenc.evals.suite.spec import ContextSpec, SuitePreset

__all__ = ["SUITE_PRESETS"]

_BOOK = ContextSpec("book", ("niah",), seeds=1, target=512)
_PASSKEY = ContextSpec("noise", ("passkey",), seeds=4)
_DYNAMIC_STEP = {"dynamic_ntk": {"step": 512}, "dynamic_yarn": {"step": 512}, "dynamic_ntk_qwen": {"step": 512}}
_SHORT = ("none", "yarn", "selfextend", "streaming_llm")
_FULL_CONTEXTS = (_BOOK, ContextSpec("noise", ("passkey",), seeds=2),
                  ContextSpec("noise", ("passkey",), seeds=2, first_seed=2, max_length=16384),
                  ContextSpec("noise", ("mv", "vt", "cwe"), seeds=1, max_length=8192))

_PAIRED = ("none", "selfextend", "dca", "yarn", "string", "retrieval", "resonance+yarn", "dca@qwen")

# posenc tune smollm2 --length 16384 --budget 32 (benchmarks/results/tune-smollm2-16k/results.json): its best LongRoPE
# factor vector (a mutation of the first population; 5th of the 16 candidates, second to SelfExtend at its defaults)
_TUNED_LONGROPE_16K = {
    "factor": 2.0, "short_factor": [1.0] * 32,
    "long_factor": [1.0, 1.0226, 1.0226, 1.0226, 1.0936, 1.0936, 1.1436, 1.1436, 1.1959, 1.1959, 1.1959, 1.4673,
                    1.4673, 1.4673, 1.4673, 1.4673, 1.4673, 1.4673, 1.6078, 1.6078, 1.6078, 1.6078, 1.9408, 2.0, 2.0,
                    2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]}

# posenc tune smollm2 --length 32768 --budget 32 (benchmarks/results/tune-smollm2-32k/results.json): its best LongRoPE
# vector (a mutation of the first population, second to the winner, NTK with factor 6) and the winner's factor
_TUNED_LONGROPE_32K = {
    "factor": 4.0, "short_factor": [1.0] * 32,
    "long_factor": [1.0, 1.0, 1.0, 1.1436, 1.1959, 1.2506, 1.3078, 1.3676, 1.4301, 1.4955, 1.4955, 1.6354, 1.6354,
                    1.8016, 1.8016, 2.0119, 2.0452, 2.1053, 2.1226, 3.0769, 4.3967, 4.3967, 4.3967, 4.3967, 4.3967,
                    4.3967, 4.3967, 4.3967, 4.3967, 4.3967, 4.3967, 4.3967]}
_TUNED_NTK_32K = {"factor": 6.0}

SUITE_PRESETS: dict[str, SuitePreset] = {p.name: p for p in (
    SuitePreset(
        "smollm2", "SmolLM2-135M (trained at 8k): untouched, YaRN, SelfExtend, StreamingLLM at 8k and 16k; "
        "~45 min on 2 idle cores", lengths=(8192, 16384), methods=_SHORT, contexts=(_BOOK, _PASSKEY),
        reference_length=8192, params=_DYNAMIC_STEP),
    SuitePreset(
        "smollm2_full", "SmolLM2-135M (trained at 8k): every training-free RoPE method at 4k-32k; hours, resumable",
        lengths=(4096, 8192, 16384, 32768),
        methods=(*_SHORT, "pi", "ntk", "ntk_mixed", "dynamic_ntk", "dynamic_yarn", "llama3", "rerope", "leaky_rerope",
                 "dca", "dca@chunkllama", "dca@qwen", "string", "resonance", "resonance+yarn", "rerope+logn",
                 "ntk_mixed+logn", "lm_infinite", "sliding_window", "retrieval", "duo"),
        contexts=_FULL_CONTEXTS,
        reference_length=8192, prune_from=32768, compare_to=("selfextend", "dca", "yarn"),
        params={**_DYNAMIC_STEP, "dca@chunkllama": {"temperature": "chunkllama"}, "dca@qwen": {"temperature": "qwen"},
                "duo": {"streaming": "calibrate"}}),
    SuitePreset(
        "smollm2_tune16k", "SmolLM2-135M: posenc tune's 16k LongRoPE factors next to the untouched model, YaRN and "
        "SelfExtend (the tune's winner) at 8k and 16k on smollm2_full's contexts, as transformers serves the factors "
        "and on posenc's engine; ~30 min with --cells of a smollm2_full run that holds the other rows",
        lengths=(8192, 16384),
        methods=("none", "yarn", "selfextend", "longrope@tune16k", "longrope@engine16k"), contexts=_FULL_CONTEXTS,
        reference_length=8192, params={"longrope@tune16k": _TUNED_LONGROPE_16K,
                                       "longrope@engine16k": {**_TUNED_LONGROPE_16K, "native": False, "step": 512}}),
    SuitePreset(
        "smollm2_tune32k", "SmolLM2-135M: posenc tune's 32k winner (NTK, factor 6) and its best LongRoPE factors "
        "next to the untouched model, YaRN and SelfExtend at 8k, 16k and 32k on smollm2_full's contexts, the factors "
        "as transformers serves them and on posenc's engine; ~1.3 h with --cells of a smollm2_full run",
        lengths=(8192, 16384, 32768),
        methods=("none", "yarn", "selfextend", "ntk@tune32k", "longrope@tune32k", "longrope@engine32k"),
        contexts=_FULL_CONTEXTS, reference_length=8192,
        params={"ntk@tune32k": _TUNED_NTK_32K, "longrope@tune32k": _TUNED_LONGROPE_32K,
                "longrope@engine32k": {**_TUNED_LONGROPE_32K, "native": False, "step": 512}}),
    SuitePreset(
        "smollm2_paired16k", "SmolLM2-135M: the rows that extend at 16k with 8 more pass keys there (n = 12), "
        "compared key by key with SelfExtend, DCA and YaRN; ~2 h with --cells of a smollm2_full run",
        lengths=(8192, 16384), methods=_PAIRED,
        contexts=(*_FULL_CONTEXTS, ContextSpec("noise", ("passkey",), seeds=8, first_seed=4, min_length=16384)),
        reference_length=8192, compare_to=("selfextend", "dca", "yarn"), params={"dca@qwen": {"temperature": "qwen"}}),
)}
