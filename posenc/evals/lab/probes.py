"""The retrieval probes of ``posenc bench``: passkey, the single-needle recall (a content-copy control) and
the key-matching probes ``kv_recall`` / ``offset`` (:mod:`posenc.tasks.kv_recall`), as
:class:`~posenc.evals.records.RetrievalRecord` rows.

Every row's ``extra`` holds the training ``seed`` of the model it measures. :func:`content_copy_records` adds
the control rows of scheme ``"content_copy"``: the accuracy, on the very same probe sequences, of a scorer that
answers with a value of the window chosen by content alone (no key, no position).
"""

from __future__ import annotations

import time

from posenc.evals.records import RetrievalRecord

__all__ = ["CONTENT_COPY", "content_copy_records", "passkey_cells", "passkey_records", "probe_cells", "probe_tasks",
           "retrieval_records", "variants"]

CONTENT_COPY = "content_copy"  # the scheme name of the content-only control rows


def variants(model, methods, length: int):
    """``(method, model under it in eval mode, its parameters)`` for each method that applies to ``model`` and
    reaches ``length`` tokens (a method that does not apply, or an embedding table too short, is skipped)."""
    from posenc.evals.lab.evaluate import model_variant

    for method in methods:
        try:
            m, params = model_variant(model, method, length)
        except ValueError:
            continue
        if m.scheme.max_positions is None or length <= m.scheme.max_positions:
            yield method, m.eval(), params


def passkey_cells(model, preset, methods, tokenizer) -> dict[tuple[str, int], list[dict]]:
    """Passkey grid (``passkey_lengths`` x ``passkey_depths`` x ``passkey_trials``) of every method on
    ``model``: ``{(method, length): [cells]}``. Prompts without the instruction sentence
    (``posenc.tasks.passkey.passkey_grid(instruction=None)``) so that they fit a few ``L``; the last answer digit
    is never an input, so the model sees ``length + digits - 1`` tokens, and the prompt is cut by that.
    A cell's ``distance`` is the mean number of tokens from the key line's start to the question's end."""
    from posenc.tasks.passkey import passkey_grid, run_passkey

    digits = 5
    out: dict[tuple[str, int], list[dict]] = {}
    for length in preset.passkey_lengths:
        try:
            prompts = passkey_grid([length - (digits - 1)], preset.passkey_depths, preset.passkey_trials,
                                   tokenizer, preset.seed, digits=digits, instruction=None)
        except ValueError:
            continue  # too short for a prompt
        for method, m, _ in variants(model, methods, length):
            res = run_passkey(lambda x, m=m: m(x, impl="auto"), prompts)
            dist = {}
            for t in res["trials"]:
                dist.setdefault(t["depth"], []).append(t["length"] - t["key_start"])
            out[(method, length)] = [{"length": length, "depth": c["depth"], "accuracy": c["accuracy"],
                                      "digit_accuracy": c["digit_accuracy"], "n": c["n"],
                                      "distance": round(sum(dist[c["depth"]]) / len(dist[c["depth"]]))}
                                     for c in res["cells"]]
    return out


def passkey_records(name: str, train_len: int, pk: dict, seed: int) -> list[RetrievalRecord]:
    """The passkey cells as retrieval records (task ``"passkey"``; chance is not defined)."""
    return [RetrievalRecord("passkey", name, method, train_len, length, c["distance"], c["accuracy"], c["n"],
                            extra={"depth": c["depth"], "digit_accuracy": c["digit_accuracy"], "seed": seed})
            for (method, length), cs in pk.items() for c in cs]


def probe_tasks(preset) -> tuple[str, ...]:
    """The retrieval tasks of ``preset``'s recall rows: the single needle, or the two key-matching probes."""
    return ("kv_recall", "offset") if preset.recall_task == "kv" else ("recall",)


def probe_cells(preset, n: int) -> list[tuple[str, int]]:
    """``(task, distance)`` of every retrieval cell at length ``n``: each task at the preset's
    :func:`~posenc.tasks.recall.probe_distances` (``recall_distances`` fractions of ``L`` when set) that fit."""
    from posenc.tasks.kv_recall import KVSpec, distance_range
    from posenc.tasks.recall import probe_distances

    fractions = {} if preset.recall_distances is None else {"fractions": preset.recall_distances}
    ds = probe_distances(preset.train_len, n, **fractions)
    lo, hi = distance_range(n, KVSpec(pairs=preset.recall_pairs))
    return [(task, d) for task in probe_tasks(preset) for d in ds if task == "recall" or lo <= d <= hi]


def _probes(preset, tokens, n: int):
    """``[(task, probe, chance)]`` at length ``n``, one per :func:`probe_cells` cell, ``recall_trials`` sequences
    each (the same sequences for every model and method)."""
    from posenc.tasks.kv_recall import KVSpec, kv_probe
    from posenc.tasks.recall import RecallSpec, recall_probe

    out = []
    for task, d in probe_cells(preset, n):
        if task == "recall":
            spec = RecallSpec(pairs=preset.recall_pairs)
            out.append((task, recall_probe(tokens, n, d, preset.recall_trials, preset.seed, spec), spec.chance))
        else:
            spec = KVSpec(pairs=preset.recall_pairs)
            out.append((task, kv_probe(tokens, task, n, d, preset.recall_trials, preset.seed, spec), spec.chance))
    return out


def retrieval_records(model, preset, methods, tokens, name: str, log, lengths, seed: int) -> list[RetrievalRecord]:
    """The recall probes (:func:`probe_tasks`) of every method on ``model`` at each of ``lengths``."""
    from posenc.tasks.recall import score_recall

    L = preset.train_len
    out: list[RetrievalRecord] = []
    for n in lengths:
        t = time.perf_counter()
        probes = _probes(preset, tokens, n)
        for method, m, params in variants(model, methods, n):
            for task, p, chance in probes:
                acc = score_recall(lambda x, m=m: m(x, impl="auto"), p, batch_size=preset.eval_batch_size * 4)
                out.append(RetrievalRecord(task, name, method, L, n, p.distance, acc, len(p.answers), chance,
                                           params=params, extra={"seed": seed}))
        log(f"  recall at {n}: {len(methods)} method(s) x {len(probes)} probes in {time.perf_counter() - t:.1f}s")
    return out


def content_copy_records(preset, tokens) -> list[RetrievalRecord]:
    """The control of the key-matching probes: at every length and distance, the accuracy on the same probe
    sequences of :func:`posenc.tasks.kv_recall.content_copy_accuracy` (a value of the window by content alone),
    as rows of scheme ``"content_copy"``, method ``"none"``; nothing for the single-needle probe."""
    from posenc.tasks.kv_recall import KVSpec, content_copy_accuracy

    out: list[RetrievalRecord] = []
    if preset.recall_task != "kv":
        return out
    spec = KVSpec(pairs=preset.recall_pairs)
    for n in preset.recall_lengths:
        for task, p, chance in _probes(preset, tokens, n):
            acc = content_copy_accuracy(p, spec, preset.seed)
            out.append(RetrievalRecord(task, CONTENT_COPY, "none", preset.train_len, n, p.distance, acc,
                                       len(p.answers), chance, extra={"seed": preset.seed}))
    return out
