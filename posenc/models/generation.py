"""Generation with the posenc KV cache: batched ragged prompts, sampling, and streaming.

:func:`generate` decodes from a :class:`posenc.TinyLM` with a :class:`posenc.models.cache.KVCache` of
un-rotated keys and original positions, so every scheme (dynamic NTK / YaRN, ReRoPE, SelfExtend,
ALiBi, T5, windows, StreamingLLM sinks) decodes exactly as a full forward over the same tokens
would score them (the tests check this to 1e-5 relative error).

Ragged prompts share one batch by *left padding*: ``attention_mask [B,N]`` is 0 on padding, which
must come first in each row. Each row's positions start at 0 at its first real token
(``positions = cumsum(mask) - 1`` clamped at 0) and padding keys are hidden from every query via the
engine's ``key_mask``, so a row's result does not depend on how much it was padded.

:class:`StreamingSession` / :func:`stream_tokens` feed an unbounded token stream through a bounded
scheme (StreamingLLM: ``model.with_scheme("streaming_llm", window=..., n_sinks=...)``, Xiao et al.,
arXiv 2309.17453) with memory bounded by ``n_sinks + window`` keys per layer.

Command line (:mod:`posenc.cli.generate`):
``posenc generate RUN_DIR --prompt TEXT [--method NAME --param k=v] [--stream]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from posenc._util import check_finite, check_positive_int
from posenc.models.cache import KVCache, cache_mask


# ====================================================================== helpers
def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions ``[B,N]`` for a left-padded batch: ``cumsum(mask) - 1`` clamped at 0 (padding gets 0)."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def _check_prompt(input_ids, attention_mask):
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
        raise ValueError("input_ids must be an integer tensor [batch, seq]")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids must hold at least one token per row")
    if attention_mask is None:
        return torch.ones_like(input_ids, dtype=torch.bool)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape "
                         f"{tuple(input_ids.shape)}")
    m = attention_mask.long()
    if bool(((m != 0) & (m != 1)).any()):
        raise ValueError("attention_mask must contain only 0 (padding) and 1 (token)")
    if bool((m[:, 1:] < m[:, :-1]).any()) or not bool(m[:, -1].all()):
        raise ValueError("attention_mask must be left padding: zeros first, then ones, last column all ones "
                         "(pad on the left to batch ragged prompts)")
    return m.bool()


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ``[B]`` from ``logits [B,V]``: argmax when ``temperature == 0``, else softmax sampling of
    ``logits / temperature`` restricted to the ``top_k`` largest and to the smallest set whose
    probability reaches ``top_p`` (nucleus, Holtzman et al., arXiv 1904.09751)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    x = logits.float() / temperature
    if top_k is not None and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # the first token is always kept
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, order, sorted_x)
    probs = torch.softmax(x, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def resident_memory_bytes() -> int:
    """Resident set size of this process from ``/proc/self/statm`` (0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# ====================================================================== generate
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, attention_mask: torch.Tensor | None = None,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             eos_token_id: int | None = None, seed: int | None = None, prefill_chunk: int | None = None,
             stream: Callable[[int, torch.Tensor], None] | None = None, use_cache: bool = True,
             max_len: int | None = None, impl: str = "auto") -> torch.Tensor:
    """Autoregressive decoding; returns ``[B, N + new]`` (prompt, padding included, then new tokens).

    ``attention_mask`` (1 = token, 0 = left padding) batches ragged prompts. ``temperature == 0`` is
    greedy; otherwise ``top_k`` / ``top_p`` sampling with ``seed``. Rows that emitted
    ``eos_token_id`` keep emitting it; decoding stops early once every row has (so ``new`` may be
    < ``max_new_tokens``). ``prefill_chunk`` feeds the prompt in chunks (bounded schemes then never
    hold more than window + chunk keys). ``stream(step, tokens [B])`` is called for every new token.
    ``use_cache=False`` recomputes the whole sequence every step (the reference the cache is tested
    against). ``max_len`` caps the cache (``ValueError`` if the scheme needs more)."""
    mask = _check_prompt(input_ids, attention_mask)
    check_positive_int("max_new_tokens", max_new_tokens)
    check_finite("temperature", temperature, minimum=0.0)
    if top_k is not None:
        check_positive_int("top_k", top_k)
    if top_p is not None:
        check_finite("top_p", top_p, minimum=0.0, maximum=1.0, strict_min=True)
    if prefill_chunk is not None:
        check_positive_int("prefill_chunk", prefill_chunk)
    B, N = input_ids.shape
    positions = left_padded_positions(mask)
    gen = None
    if seed is not None:
        gen = torch.Generator(device=input_ids.device).manual_seed(int(seed))
    cache = None
    if use_cache:
        cache = KVCache.for_model(model, B, max_len=max_len)
        if max_len is not None and cache.bound is None and N + max_new_tokens > max_len:
            raise ValueError(f"max_len={max_len} is too small: the prompt ({N} slots incl. padding) + "
                             f"max_new_tokens ({max_new_tokens}) need {N + max_new_tokens} and scheme "
                             f"{model.scheme.name!r} keeps every key")
    was_training = model.training
    model.eval()
    ids, pos, msk = input_ids, positions, mask
    out = [input_ids]
    finished = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    try:
        with torch.no_grad():
            if cache is not None:
                step = prefill_chunk or N
                for s in range(0, N, step):
                    logits = model(ids[:, s:s + step], positions=pos[:, s:s + step], cache=cache, impl=impl,
                                   attention_mask=msk[:, s:s + step])
            else:
                logits = model(ids, positions=pos, impl=impl, attention_mask=msk)
            next_pos = positions[:, -1] + 1
            seq, seq_pos, seq_mask = ids, pos, msk
            for t in range(max_new_tokens):
                tok = sample_next(logits[:, -1], temperature, top_k, top_p, gen)
                if eos_token_id is not None:
                    tok = torch.where(finished, torch.full_like(tok, eos_token_id), tok)
                    finished = finished | (tok == eos_token_id)
                out.append(tok[:, None])
                if stream is not None:
                    stream(t, tok)
                if t == max_new_tokens - 1 or (eos_token_id is not None and bool(finished.all())):
                    break
                if cache is not None:
                    logits = model(tok[:, None], positions=next_pos[:, None], cache=cache, impl=impl)
                else:
                    seq = torch.cat([seq, tok[:, None]], dim=1)
                    seq_pos = torch.cat([seq_pos, next_pos[:, None]], dim=1)
                    seq_mask = torch.cat([seq_mask, torch.ones_like(tok[:, None], dtype=torch.bool)], dim=1)
                    logits = model(seq, positions=seq_pos, impl=impl, attention_mask=seq_mask)
                next_pos = next_pos + 1
    finally:
        model.train(was_training)
    return torch.cat(out, dim=1)


# ====================================================================== streaming
class StreamingSession:
    """Feed an unbounded token stream through a model whose scheme keeps a bounded set of keys
    (StreamingLLM's sinks + window, a sliding window, LM-Infinite). Memory stays O(bound + chunk).

    ``feed(tokens [B,n] or [n]) -> logits [B,n,V]``; ``feed_losses(tokens) -> [B,n]`` next-token
    negative log-likelihood of each fed token given everything before it (NaN for the very first).
    """

    def __init__(self, model, batch_size: int = 1, chunk: int = 1, impl: str = "auto"):
        check_positive_int("chunk", chunk)
        if cache_mask(model).bounded_size() is None:
            raise ValueError(f"scheme {model.scheme.name!r} keeps every key, so memory would grow without bound; "
                             f"use model.with_scheme('streaming_llm', window=..., n_sinks=...) for streaming")
        self.model, self.chunk, self.impl = model, chunk, impl
        self.cache = KVCache.for_model(model, batch_size)
        self.batch_size = batch_size
        self._last_logits: torch.Tensor | None = None  # [B,V] prediction for the next token
        self.max_slots = 0  # most key slots the cache ever held (committed + chunk)
        self.max_capacity = 0

    @property
    def tokens_seen(self) -> int:
        return self.cache.tokens_seen

    def feed(self, tokens) -> torch.Tensor:
        """Logits ``[B,n,V]`` of ``tokens`` (``[B,n]`` or ``[n]``, on any device: moved to the model's)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.cache.device)
        if tokens.dim() == 1:
            tokens = tokens[None]
        if tokens.dim() != 2 or tokens.shape[0] != self.batch_size:
            raise ValueError(f"tokens must be [n] or [{self.batch_size}, n], got {tuple(tokens.shape)}")
        outs = []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for s in range(0, tokens.shape[1], self.chunk):
                    outs.append(self.model(tokens[:, s:s + self.chunk], cache=self.cache, impl=self.impl))
                    self.max_slots = max(self.max_slots, self.cache.peak_length)
                    self.max_capacity = max(self.max_capacity, self.cache.capacity)
        finally:
            self.model.train(was_training)
        logits = torch.cat(outs, dim=1) if outs else torch.zeros(self.batch_size, 0, self.model.cfg.vocab_size,
                                                                  device=self.cache.device)
        return logits

    def feed_losses(self, tokens) -> torch.Tensor:
        """Next-token loss ``[B,n]`` of each fed token (NaN for the very first token of the stream)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.cache.device)
        if tokens.dim() == 1:
            tokens = tokens[None]
        logits = self.feed(tokens)
        if logits.shape[1] == 0:
            return torch.zeros(self.batch_size, 0, device=tokens.device)
        first = (self._last_logits if self._last_logits is not None
                 else torch.full_like(logits[:, 0], float("nan")))
        preds = torch.cat([first[:, None], logits[:, :-1]], dim=1)  # [B,n,V] prediction of each token
        self._last_logits = logits[:, -1]
        return F.cross_entropy(preds.transpose(1, 2).float(), tokens, reduction="none")


def stream_tokens(model, token_iter: Iterable[int], chunk: int = 64, output: str = "loss",
                  impl: str = "auto") -> Iterator:
    """Run an (unbounded) iterable of token ids through ``model`` with bounded memory, ``chunk`` tokens
    per forward; yields, per token, its float next-token loss (``output="loss"``; NaN for the first)
    or its logits ``[V]`` (``output="logits"``)."""
    if output not in ("loss", "logits"):
        raise ValueError(f"output must be 'loss' or 'logits', got {output!r}")
    session = StreamingSession(model, 1, chunk=chunk, impl=impl)
    buf: list[int] = []

    def flush():
        t = torch.tensor(buf, dtype=torch.long, device=session.cache.device)
        if output == "loss":
            yield from session.feed_losses(t)[0].tolist()
        else:
            yield from session.feed(t)[0]

    for tok in token_iter:
        buf.append(int(tok))
        if len(buf) == chunk:
            yield from flush()
            buf = []
    if buf:
        yield from flush()

