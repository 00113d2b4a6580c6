"""llama.cpp as an optional engine, through llama-cpp-python's low-level API (``pip install posenc[llamacpp]``, built
from source by ``make llamacpp``): a GGUF opened the way posenc compares engines (:func:`open_gguf`), the next-token
logits of a prompt (:func:`next_token_logits`), and SelfExtend as llama.cpp's group attention
(:func:`selfextend_logits`, :func:`selfextend_answer`).

**SelfExtend on llama.cpp.** llama.cpp has no two-branch attention: its ``--grp-attn-n G --grp-attn-w W``
(``tools/completion``; the passkey example is the window-less variant) keeps one KV cache and, before each chunk of
tokens, whenever ``W`` tokens have gathered since the last grouped block, *moves* the cached keys: the block's
positions are divided by ``G`` (``llama_memory_seq_div``, a floor) and every later key is shifted down to follow it
(``llama_memory_seq_add``); RoPE of the shift is applied to the cached keys (RoPE composes: a key at ``p`` turned by
``p // G - p`` is a key at ``p // G``). posenc divides with one ``seq_add`` per position: llama.cpp's own
``llama_memory_seq_div`` records the key's shift with the wrong sign in this version (:class:`GroupAttention`).
A query at original position ``q`` is then at ``E / G + (q - E)``, ``E``
the original position where the grouped blocks end (a multiple of ``W``); keys at or after ``E`` keep their exact
distance, a key ``k < E`` is at distance ``E / G + (q - E) - k // G``.

Which of posenc's conventions it matches: posenc's SelfExtend (LongLM's merged formula, ``selfextend`` with
``group`` G and ``window`` w: exact distance below ``w``, else ``q // G + w - w // G - k // G``) with the floor
grouping of keys and the query offset ``w - w // G`` **and a per-query window** ``w(q) = q - E(q)``: with
``G | E`` the two formulas are the same numbers (``q // G = E / G + (q - E) // G``). So llama.cpp's group attention
equals posenc's SelfExtend exactly for a query whose window ``q - E`` is ``w``; other queries see a window anywhere in
``[0, W + chunk)``, which changes as blocks are grouped (posenc's is the same ``w`` for every query). The mapping used
here is ``--grp-attn-n = group``, ``--grp-attn-w = window``; llama.cpp needs ``G | W`` (refused otherwise; posenc's
floor convention equals LongLM's main patch then). How far apart the two are in logits and pass keys is measured by
``benchmarks/bench_llamacpp_selfextend.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GroupAttention", "check_build", "llama_cpp", "next_token_logits", "open_gguf", "selfextend_answer",
           "selfextend_logits"]


def llama_cpp():
    """The ``llama_cpp`` module, or a one-line ``ValueError`` saying how to build it."""
    try:
        import llama_cpp as module
    except ImportError:
        raise ValueError("llama-cpp-python is not installed: `make llamacpp` builds it from source into .venv "
                         "(pip install 'posenc[llamacpp]' --no-binary llama-cpp-python)") from None
    return module


#: what :func:`check_build` runs in a fresh process: the bundled model's logits after 32 tokens, through llama.cpp
_FIRST_DECODE = """
import sys
import numpy as np
from posenc.hf.llamacpp import next_token_logits, open_gguf
from posenc.hf.source import bundled_gguf
llm = open_gguf(bundled_gguf("smollm2"), n_ctx=64)
x = next_token_logits(llm, list(range(100, 132)))
sys.exit(0 if x.shape == (1, llm.n_vocab()) and np.isfinite(x).all() else 3)
"""


def check_build(timeout: float = 300.0) -> None:
    """Run llama.cpp's first decode (the bundled SmolLM2, 32 tokens) in a child process; a one-line ``RuntimeError``
    if it dies or gives non-finite logits. A build compiled for another CPU (``GGML_NATIVE`` on a machine with
    instructions this one lacks, e.g. a wheel pip cached elsewhere) loads fine and dies with ``SIGILL`` at its first
    matrix product: this says so once, instead of a crashed test worker per test."""
    import signal
    import subprocess
    import sys

    llama_cpp()
    done = subprocess.run([sys.executable, "-c", _FIRST_DECODE], capture_output=True, text=True, timeout=timeout)
    if done.returncode == 0:
        return
    if done.returncode < 0:
        why = f"died of {signal.Signals(-done.returncode).name}"
    elif done.returncode == 3:
        why = "gave non-finite logits"
    else:
        why = f"failed (exit {done.returncode}: {(done.stderr.strip().splitlines() or ['no output'])[-1]})"
    raise RuntimeError(f"llama.cpp {why} on its first decode of the bundled model: rebuild it for this machine "
                       f"with `rm -f .venv/.llamacpp && make llamacpp`")


def open_gguf(path, n_ctx: int, *, threads: int = 2, n_batch: int = 512, flash_attn: bool = False, **kw):
    """A ``llama_cpp.Llama`` on the GGUF ``path`` with a context of ``n_ctx`` tokens, ``threads`` threads for prompt
    and decode, chunks of ``n_batch`` tokens (also the micro-batch), flash attention on or off, llama.cpp's log off;
    ``kw`` go to ``Llama`` (e.g. ``rope_scaling_type``, ``rope_freq_scale``, ``yarn_orig_ctx``)."""
    lc = llama_cpp()
    return lc.Llama(model_path=str(path), n_ctx=int(n_ctx), n_batch=int(n_batch), n_ubatch=int(n_batch),
                    n_threads=int(threads), n_threads_batch=int(threads), flash_attn=bool(flash_attn),
                    verbose=False, **kw)


class _Batch:
    """One ``llama_batch`` of up to ``size`` tokens of sequence 0 at explicit positions."""

    def __init__(self, lc, size: int):
        self.lc, self.size = lc, size
        self.batch = lc.llama_batch_init(size, 0, 1)

    def decode(self, ctx, tokens, first_pos: int, outputs: int = 1) -> None:
        """Decode ``tokens`` at ``first_pos, first_pos + 1, ...``, with logits for the last ``outputs`` of them."""
        b = self.batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = int(t), first_pos + i, 1
            b.logits[i] = i >= len(tokens) - outputs
            b.seq_id[i][0] = 0
        b.n_tokens = len(tokens)
        rc = self.lc.llama_decode(ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for {len(tokens)} tokens at position {first_pos}")

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)


def _last_logits(llm, i: int = -1) -> np.ndarray:
    lc = llama_cpp()
    ptr = lc.llama_get_logits_ith(llm.ctx, i)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32)


def _clear(llm):
    lc = llama_cpp()
    mem = lc.llama_get_memory(llm.ctx)
    lc.llama_memory_clear(mem, True)
    return mem


def next_token_logits(llm, tokens, last: int = 1) -> np.ndarray:
    """llama.cpp's logits (float32 ``[last, vocab]``) at the last ``last`` positions of ``tokens`` (each for the token
    after it), from an empty cache, in chunks of the context's ``n_batch`` (``last`` at most that)."""
    lc = llama_cpp()
    _clear(llm)
    n = llm.n_batch
    if not 1 <= last <= min(n, len(tokens)):
        raise ValueError(f"last must be in [1, min(n_batch {n}, {len(tokens)} tokens)], got {last}")
    head = list(tokens[:len(tokens) - last])
    batch = _Batch(lc, n)
    try:
        for i in range(0, len(head), n):
            batch.decode(llm.ctx, head[i:i + n], i)
        batch.decode(llm.ctx, list(tokens[len(head):]), len(head), outputs=last)
    finally:
        batch.close()
    return np.stack([_last_logits(llm, i) for i in range(last)])


@dataclass
class GroupAttention:
    """llama.cpp's group-attention state (``tools/completion``): ``n_past`` the next position in the moved
    (grouped) position space, ``ga_i`` where the grouped positions end in it.

    The division of a block's positions is done as one ``llama_memory_seq_add`` per position (delta ``p // G - p``),
    not with ``llama_memory_seq_div``: in the llama.cpp that llama-cpp-python 0.3.36 vendors,
    ``llama_kv_cells::pos_div`` stores the position ``p // G`` but records the key shift as ``p - p // G``, the
    opposite sign of ``pos_add``'s ``new - old``, so the cached key is rotated to ``2p - p // G`` instead of
    ``p // G`` (the positions the mask and the queries use are right, the keys' rotation is not). ``stock_div=True``
    calls ``llama_memory_seq_div`` as ``llama-completion`` does, to measure that."""

    group: int
    window: int
    n_past: int = 0
    ga_i: int = 0
    stock_div: bool = False  # True: llama_memory_seq_div itself, keys rotated the wrong way (class docstring)

    def __post_init__(self):
        if self.group < 1 or self.window < 1 or self.window % self.group:
            raise ValueError(f"llama.cpp's group attention needs --grp-attn-w (window {self.window}) to be a positive "
                             f"multiple of --grp-attn-n (group {self.group})")

    def compress(self, lc, mem) -> None:
        """Group every full block of ``window`` keys gathered since the last one (completion.cpp's loop)."""
        G, W = self.group, self.window
        if G == 1:
            return
        while self.n_past >= self.ga_i + W:
            ib = (G * self.ga_i) // W
            bd = (W // G) * (G - 1)
            dd = (W // G) - ib * bd - W
            lc.llama_memory_seq_add(mem, 0, self.ga_i, self.n_past, ib * bd)
            self._divide(lc, mem, self.ga_i + ib * bd, self.ga_i + ib * bd + W)
            lc.llama_memory_seq_add(mem, 0, self.ga_i + ib * bd + W, self.n_past + ib * bd, dd)
            self.n_past -= bd
            self.ga_i += W // G

    def _divide(self, lc, mem, p0: int, p1: int) -> None:
        """Positions ``[p0, p1)`` floor-divided by the group, keys rotated by ``p // G - p``: in increasing order, each
        target ``p // G`` lies below every position still to move."""
        G = self.group
        if self.stock_div:
            lc.llama_memory_seq_div(mem, 0, p0, p1, G)
            return
        for p in range(p0, p1):
            if p // G != p:
                lc.llama_memory_seq_add(mem, 0, p, p + 1, p // G - p)

    def feed(self, llm, batch: _Batch, mem, tokens, chunk: int) -> None:
        """Decode ``tokens`` in chunks of ``chunk``, grouping before each chunk."""
        lc = llama_cpp()
        for i in range(0, len(tokens), chunk):
            self.compress(lc, mem)
            part = tokens[i:i + chunk]
            batch.decode(llm.ctx, part, self.n_past)
            self.n_past += len(part)


def selfextend_logits(llm, tokens, group: int, window: int, *, chunk: int | None = None) -> np.ndarray:
    """The next-token logits after ``tokens`` with SelfExtend as llama.cpp's group attention (module docstring):
    posenc's ``group`` is ``--grp-attn-n``, its ``window`` ``--grp-attn-w``; ``chunk`` tokens per decode call (default
    the context's ``n_batch``)."""
    lc = llama_cpp()
    chunk = int(chunk or llm.n_batch)
    mem = _clear(llm)
    state = GroupAttention(int(group), int(window))
    batch = _Batch(lc, chunk)
    try:
        state.feed(llm, batch, mem, list(tokens), chunk)
    finally:
        batch.close()
    return _last_logits(llm)


def selfextend_answer(llm, context, query, group: int, window: int, *, max_new_tokens: int, decode,
                      eos: int | None = None, chunk: int | None = None, stock_div: bool = False) -> str:
    """Greedy answer to ``query`` (token ids) after ``context`` (token ids) under llama.cpp's group attention, decoded
    one token at a time with grouping before each (as ``llama-completion --grp-attn-n --grp-attn-w``), stopped the
    way posenc's suite stops (:func:`posenc.tasks.score.answer_text`: a line break after some text), at ``eos`` or
    after ``max_new_tokens``. ``decode``: token ids -> text (the model's own tokenizer). ``stock_div``: llama.cpp's
    own ``llama_memory_seq_div`` (:class:`GroupAttention`)."""
    from posenc.tasks.score import answer_text

    lc = llama_cpp()
    chunk = int(chunk or llm.n_batch)
    mem = _clear(llm)
    state = GroupAttention(int(group), int(window), stock_div=stock_div)
    batch = _Batch(lc, chunk)
    out: list[int] = []
    try:
        state.feed(llm, batch, mem, list(context), chunk)
        state.feed(llm, batch, mem, list(query), chunk)
        for _ in range(max_new_tokens):
            nxt = int(np.argmax(_last_logits(llm)))
            if eos is not None and nxt == eos:
                break
            out.append(nxt)
            text = decode(out)
            if answer_text(text, False) != text.strip():
                break
            state.feed(llm, batch, mem, [nxt], 1)
    finally:
        batch.close()
    return decode(out)
