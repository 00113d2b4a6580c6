"""posenc.hf.llamacpp: llama.cpp's group attention is posenc's SelfExtend with a per-query window (checked on a model
of llama.cpp's cache positions, no llama.cpp needed), and, in the slow tier with llama-cpp-python built
(`make llamacpp`), the GGUF posenc writes loads in llama.cpp with its rope settings as written, llama.cpp's next
token agrees with posenc's transformers path on SmolLM2 at ~4k, and SelfExtend through llama.cpp finds the pass keys
posenc's finds at 16k."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from posenc.hf.llamacpp import GroupAttention
from posenc.parts.remap import SelfExtend

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


class _Positions:
    """llama.cpp's cells of sequence 0 as ``llama-kv-cells.h`` keeps them: a position per cell and the angle its
    cached key is turned to (its first position plus every recorded shift); ``llama_memory_seq_add``/``_div`` over
    ``[p0, p1)`` (``p1 < 0``: to the end), ``pos_add`` recording ``new - old`` and ``pos_div`` ``old - new``."""

    def __init__(self):
        self.pos: list[int] = []
        self.rotated: list[int] = []

    def append(self, positions):
        self.pos += positions
        self.rotated += positions

    def _moved(self, p0, p1, new):
        hit = [p0 <= p and (p1 < 0 or p < p1) for p in self.pos]
        old = self.pos
        self.pos = [new(p) if h else p for p, h in zip(old, hit)]
        return [(h, o, n) for h, o, n in zip(hit, old, self.pos)]

    def llama_memory_seq_add(self, mem, seq, p0, p1, delta):
        moves = self._moved(p0, p1, lambda p: p + delta)
        self.rotated = [r + (n - o if h else 0) for r, (h, o, n) in zip(self.rotated, moves)]

    def llama_memory_seq_div(self, mem, seq, p0, p1, d):
        moves = self._moved(p0, p1, lambda p: p // d)
        self.rotated = [r + (o - n if h else 0) for r, (h, o, n) in zip(self.rotated, moves)]  # pos_div's sign


@pytest.mark.parametrize("group, window, chunk, n", [(4, 16, 8, 150), (2, 8, 8, 64), (3, 12, 5, 97), (4, 32, 16, 90)])
def test_group_attention_is_selfextend_with_the_window_q_minus_E(group, window, chunk, n):
    """Every (query, key) distance llama.cpp's group attention gives equals posenc's SelfExtend relative position
    with the same group and the window ``q - E``, ``E`` where the grouped blocks end when q is decoded."""
    lc, st = _Positions(), GroupAttention(group, window)
    checked = 0
    for start in range(0, n, chunk):
        st.compress(lc, None)
        end = min(n, start + chunk)
        lc.append(list(range(st.n_past, st.n_past + end - start)))
        st.n_past += end - start
        E = st.ga_i * group  # original position where the grouped blocks end
        assert E % window == 0 and all(lc.pos[k] == k // group for k in range(E))
        assert max(lc.pos) < n // group + window + chunk  # the largest position llama.cpp rotates by
        assert lc.rotated == lc.pos  # every cached key turned to the position the queries see it at
        for q in range(start, end):
            # window q - E = 0 (the query right after a grouped block): every key grouped, q // G - k // G, the far
            # branch's formula with w = 0 (posenc's part takes windows >= 1)
            ref = SelfExtend(group=group, window=q - E) if q > E else None
            for k in range(q + 1):
                got = lc.pos[q] - lc.pos[k]
                want = q // group - k // group if ref is None else int(ref.relative(torch.tensor(q), torch.tensor(k)))
                assert got == want, (q, k, E)
                checked += 1
    assert checked > n and st.ga_i > 0


def test_llama_cpps_own_seq_div_turns_the_grouped_keys_the_wrong_way():
    """With ``llama_memory_seq_div`` (as ``llama-completion`` calls it) the positions are right but a grouped key is
    turned to ``2p - p // G``: why :class:`GroupAttention` divides with one ``seq_add`` per position."""
    lc, st = _Positions(), GroupAttention(4, 16, stock_div=True)
    for _ in range(0, 64, 8):
        st.compress(lc, None)
        lc.append(list(range(st.n_past, st.n_past + 8)))
        st.n_past += 8
    grouped = range(st.ga_i * 4)
    assert all(lc.pos[k] == k // 4 for k in grouped)
    assert [lc.rotated[k] for k in grouped] == [2 * k - k // 4 for k in grouped]


def test_a_window_that_is_not_a_multiple_of_the_group_is_refused():
    with pytest.raises(ValueError, match="multiple of --grp-attn-n"):
        GroupAttention(4, 10)


# ===================================================================== llama.cpp itself (slow tier, `make llamacpp`)
@functools.cache
def _runs() -> str:
    """'' if llama.cpp's first decode runs in a child process, else why not (once per test process)."""
    from posenc.hf.llamacpp import check_build

    try:
        check_build()
    except RuntimeError as e:
        return str(e)
    return ""


def _llama_cpp():
    module = pytest.importorskip("llama_cpp", reason="llama-cpp-python is built by `make llamacpp`")
    if _runs():  # a build that dies on this CPU fails each test with the reason, not with a crashed worker
        pytest.fail(_runs(), pytrace=False)
    return module


@pytest.mark.parametrize("script, said", [("import os, signal; os.kill(os.getpid(), signal.SIGILL)", "died of SIGILL"),
                                          ("import sys; sys.exit(3)", "gave non-finite logits"),
                                          ("raise OSError('libllama.so: cannot open')",
                                           "failed (exit 1: OSError: libllama.so: cannot open)")])
def test_a_first_decode_that_dies_is_said_in_one_line_naming_the_rebuild(monkeypatch, script, said):
    import posenc.hf.llamacpp as llamacpp

    monkeypatch.setattr(llamacpp, "llama_cpp", lambda: None)
    monkeypatch.setattr(llamacpp, "_FIRST_DECODE", script)
    with pytest.raises(RuntimeError) as e:
        llamacpp.check_build()
    assert str(e.value) == f"llama.cpp {said} on its first decode of the bundled model: rebuild it for this " \
                           "machine with `rm -f .venv/.llamacpp && make llamacpp`"
    monkeypatch.setattr(llamacpp, "_FIRST_DECODE", "pass")
    assert llamacpp.check_build() is None


def _served(tmp_path, method, **params):
    from posenc.hf.gguf_export import serve_extended
    from posenc.hf.patch import extend
    from posenc.hf.source import bundled_gguf, load_source

    model, tok = load_source("smollm2")
    if method != "none":
        extend(model, method, **params)
    said = serve_extended(model, bundled_gguf("smollm2"), tmp_path / f"{method}.gguf")
    return model, tok, Path(said["saved"]), said


LONG = [1.0 + 0.5 * i / 31 for i in range(32)]


@pytest.mark.slow
@pytest.mark.parametrize("method, params, scale", [("yarn", {"factor": 2.0}, 0.5), ("linear", {"factor": 4.0}, 0.25),
                                                   ("longrope", {"factor": 2.0, "long_factor": LONG,
                                                                 "short_factor": [1.0] * 32}, 1.0)])
def test_the_written_gguf_loads_in_llama_cpp_with_its_rope_settings(tmp_path, method, params, scale):
    lc = _llama_cpp()
    from posenc.hf.llamacpp import open_gguf

    model, _, path, said = _served(tmp_path, method, **params)
    llm = open_gguf(path, n_ctx=256)
    meta = llm.metadata  # the keys as llama.cpp read them
    assert meta["llama.rope.scaling.type"] == said["gguf"]["scaling_type"] == method
    assert int(meta["llama.rope.scaling.original_context_length"]) == 8192
    assert lc.llama_model_n_ctx_train(llm.model) == said["gguf"]["context_length"] == \
        model.config.max_position_embeddings
    assert lc.llama_model_rope_freq_scale_train(llm.model) == pytest.approx(scale)  # longrope: no .factor key
    if method == "longrope":  # its factor tensors were accepted (llama.cpp refuses a file with unused tensors)
        assert float(meta["llama.rope.scaling.attn_factor"]) == pytest.approx(said["gguf"]["attention_factor"])
    assert meta["posenc.method"] == method
    llm.close()


def _agreement(ref: np.ndarray, got: np.ndarray) -> dict:
    def logp(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    p = np.exp(logp(ref))
    srt = np.sort(ref, -1)
    margin = srt[:, -1] - srt[:, -2]
    same = ref.argmax(-1) == got.argmax(-1)
    return {"agree": float(same.mean()), "kl_max": float((p * (logp(ref) - logp(got))).sum(-1).max()),
            "max_margin_disagreeing": float(margin[~same].max()) if (~same).any() else 0.0}


#: next-token agreement between posenc's transformers path (the GGUF's Q4_1 weights dequantised to float32, float32
#: activations) and llama.cpp (Q4_1 matmuls on activations quantised to 8 bits, an F16 KV cache) on the last 64
#: positions of the suite's 4k pass-key context. Measured (benchmarks/results/llamacpp_agreement.json): untouched and
#: YaRN x2, flash attention off and on, 255 of 256 top tokens the same, the one that differed where posenc's own
#: top-2 margin was 0.15 logits; KL(posenc || llama.cpp) at most 0.024 nats a position. Tolerance: a top token may
#: differ only where posenc's margin is below MARGIN logits (quantisation noise moves logits by up to ~1.7, so a
#: near tie can flip), and KL stays below KL_MAX, twice the largest seen.
MARGIN, KL_MAX = 0.5, 0.05


@pytest.mark.slow
@pytest.mark.parametrize("method, params", [("none", {}), ("yarn", {"factor": 2.0})])
def test_next_token_agrees_with_posencs_transformers_path_at_4k(tmp_path, method, params):
    _llama_cpp()
    from posenc.hf.llamacpp import next_token_logits, open_gguf
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack

    model, tok, path, _ = _served(tmp_path, method, **params)
    ctx = build_context(tok, make_haystack("noise", tok), 4096, ("passkey",), seed=0)
    ids = list(ctx.ids) + list(ctx.queries[0].ids)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids]), logits_to_keep=64).logits[0].float().numpy()
    got = next_token_logits(open_gguf(path, n_ctx=len(ids) + 8), ids, last=64)
    a = _agreement(ref, got)
    assert a["max_margin_disagreeing"] < MARGIN and a["kl_max"] < KL_MAX and a["agree"] > 0.9, a


def _posenc_found(length: int, group: int, window: int) -> dict[int, tuple[bool, float]]:
    """seed -> (whether posenc's SelfExtend found the pass key, the key's depth), from the committed short-preset
    suite run."""
    found = {}
    for f in sorted((RESULTS / "suite-smollm2" / "cells").glob("*.json")):
        cell = json.loads(f.read_text())
        k = cell["key"]
        if k["method"] == "selfextend" and k["length"] == length and k["generators"] == ["passkey"] \
                and k["params"] == {"window": window, "group": group}:
            answers = cell["value"]["answers"]
            found[k["seed"]] = (all(a["correct"] for a in answers), answers[0]["depth"])
    return found


@pytest.mark.slow
def test_selfextend_on_llama_cpp_finds_the_pass_keys_posencs_finds_at_16k():
    """The suite's short preset (noise:passkey:4 at 16384, SelfExtend group 4, window 4096, as the committed run):
    llama.cpp's group attention finds the key on every context where posenc's two-branch SelfExtend found it."""
    lc = _llama_cpp()
    from posenc.hf.llamacpp import open_gguf, selfextend_answer
    from posenc.hf.source import bundled_gguf, load_tokenizer
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack
    from posenc.tasks.score import score

    found = _posenc_found(16384, 4, 4096)
    assert sorted(found) == [0, 1, 2, 3] and all(ok for ok, _ in found.values())
    tok = load_tokenizer("smollm2")
    hay = make_haystack("noise", tok)
    llm = open_gguf(bundled_gguf("smollm2"), n_ctx=16384 + 64, flash_attn=True)
    eos = lc.llama_vocab_eos(lc.llama_model_get_vocab(llm.model))
    for seed in sorted(found):
        ctx = build_context(tok, hay, 16384, ("passkey",), seed=seed)
        q = ctx.queries[0]
        assert round(ctx.depth(q), 4) == found[seed][1]  # the context posenc's run answered
        text = selfextend_answer(llm, ctx.ids, q.ids, 4, 4096, max_new_tokens=q.max_new_tokens, decode=tok.decode,
                                 eos=eos)
        assert score(text, q.golds)[0], (seed, text, q.golds)
    llm.close()
