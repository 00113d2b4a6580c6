"""Where the answer looks: for each question of a suite context, the model's greedy answer and the attention weights
of the question's last token (the position whose logits give the answer's first token) per layer and head, summed
over the context's regions (:mod:`posenc.analysis.attention`: the asked needle, the other needles, the first tokens,
the question, the rest; the keys a method reads at a remapped position; the keys past the trained length).

Accuracy says *that* a key is lost; the weights say *where the attention went instead*. The context is prefilled
once; each question runs on a rewound cache (:func:`posenc.evals.suite.prefill.rewind`), once with its weights
recorded and once answered greedily as the suite answers it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc.analysis.attention import REGIONS, WeightRow, record_last_query, region_mass

__all__ = ["AnswerAttention", "answer_attention", "question_regions"]


@dataclass(frozen=True)
class AnswerAttention:
    """One question's answer and where its first token looked: ``mass[region]`` is ``[layers, heads]`` (float32)."""

    kind: str
    correct: bool
    answer: str
    distance: int
    mass: dict

    def to_dict(self) -> dict:
        return {"kind": self.kind, "correct": self.correct, "answer": self.answer, "distance": self.distance,
                "mass": {k: [[round(float(x), 5) for x in layer] for layer in v] for k, v in self.mass.items()}}


def answer_tokens(tokenizer, ids, golds) -> list[int]:
    """The indices of the tokens of ``ids`` whose decoded text overlaps an occurrence of a string of ``golds``."""
    ends, text = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(list(ids[:i + 1]))
        ends.append(len(text))
    hits = set()
    for g in golds:
        at = text.find(g)
        while at >= 0:
            lo, hi = at, at + len(g)
            hits |= {i for i in range(len(ids)) if (ends[i - 1] if i else 0) < hi and ends[i] > lo}
            at = text.find(g, at + 1)
    return sorted(hits)


def question_regions(ctx, query, n_keys: int, start: int, tokenizer=None) -> dict[str, torch.Tensor]:
    """The regions (:data:`~posenc.analysis.attention.REGIONS`) of the ``n_keys`` positions a question of ``ctx``
    reads: with ``tokenizer``, ``answer``, the tokens of its needles that spell a gold string, and ``needle`` the rest
    of them (without, ``needle`` is all of them); the other needles; the first ``start`` tokens (needles excepted);
    the question (positions from ``ctx.length``); the rest. They partition the positions."""
    own = set(query.needles)
    regions = {name: torch.zeros(n_keys, dtype=torch.bool) for name in REGIONS}
    for i, n in enumerate(ctx.needles):
        regions["needle" if i in own else "other_needles"][n.start:n.end] = True
        if i in own and tokenizer is not None:
            for j in answer_tokens(tokenizer, ctx.ids[n.start:n.end], query.golds):
                regions["answer"][n.start + j] = True
    regions["needle"] &= ~regions["answer"]
    regions["start"][:start] = True
    regions["question"][ctx.length:] = True
    taken = torch.stack([regions[r] for r in REGIONS if r != "haystack"]).any(0)
    regions["start"] &= ~(regions["answer"] | regions["needle"] | regions["other_needles"])
    regions["haystack"] = ~taken
    return regions


@torch.no_grad()
def answer_attention(model, tokenizer, ctx, *, start: int = 4, train_len: int | None = None
                     ) -> list[AnswerAttention]:
    """For each query of ``ctx``: the model's greedy answer (scored as the suite scores it) and the weights of the
    question's last token per layer and head summed over the regions (module docstring). ``model``: a transformers
    causal LM with every layer on posenc's engine; ``start``: the number of first tokens counted as ``start``;
    ``train_len``: the model's trained length, for ``beyond``. One prefill of the context, then per question its
    tokens and answer on a rewound cache (:func:`posenc.evals.suite.prefill.rewind`)."""
    from posenc.evals.suite.prefill import cache_kwarg, greedy_answer, output_cache, rewind, snapshot
    from posenc.tasks.score import score

    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    n_layers = int(model.config.get_text_config().num_hidden_layers)
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([list(ctx.ids)], device=device), use_cache=True, logits_to_keep=1)
    cache = output_cache(out)
    del out
    prefilled = snapshot(cache)
    kw = cache_kwarg(model)
    results = []
    for q in ctx.queries:
        rewind(cache, prefilled)
        rows: list[WeightRow] = []
        with record_last_query(rows):
            model(input_ids=torch.tensor([list(q.ids)], device=device), use_cache=True, logits_to_keep=1,
                  **{kw: cache})
        if len(rows) != n_layers:
            raise ValueError(f"answer_attention saw {len(rows)} attention calls in one forward of a {n_layers}-layer "
                             f"model: every layer must run on posenc's engine (posenc.hf.extend(model, method, "
                             f"native=False); the untouched model: extend(model, 'none', native=False))")
        regions = question_regions(ctx, q, ctx.length + len(q.ids), start, tokenizer)
        per_layer = [region_mass(r, regions, train_len) for r in rows]
        mass = {k: torch.stack([m[k] for m in per_layer]) for k in per_layer[0]}
        rewind(cache, prefilled)
        text, _ = greedy_answer(model, tokenizer, cache, q.ids, q.max_new_tokens, lines=len(q.golds) > 1)
        correct, _ = score(text, q.golds)
        results.append(AnswerAttention(q.kind, bool(correct), text.strip(), ctx.distance(q), mass))
    rewind(cache, prefilled)
    return results
