"""Running the suite's cells: one fresh model per (length, method), one prefill per (context, seed), each result
stored the moment it exists; a progress bar whose ETA weighs a cell by its attention cost (length squared).
:func:`cell_is_whole` is the cells folder's check: a stored value missing a field the results read (damaged on disk)
reads as missing, so the run computes that cell again and replaces the file, as it does a truncated one."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from posenc.evals.suite.prefill import run_context
from posenc.tasks.context import build_context
from posenc.tasks.haystack import make_haystack

__all__ = ["cell_is_whole", "haystack_of", "new_run", "run_cells"]


def _weight(length: int) -> float:
    """A cell's share of the progress bar: prefill cost grows like the square of the length (attention)."""
    return (length / 4096) ** 2


def _number(x, none: bool = False) -> bool:
    return (x is None and none) or isinstance(x, (int, float)) and not isinstance(x, bool)


def cell_is_whole(v) -> bool:
    """Whether a stored cell value holds every field of :func:`posenc.evals.suite.prefill.run_context` that the
    results read (:mod:`posenc.evals.suite.results`), of the right type."""
    t = v["target"]
    return (isinstance(v, dict) and isinstance(v["answers"], list)
            and all(isinstance(a["kind"], str) and isinstance(a["correct"], bool) and _number(a["chance"])
                    and _number(a["depth"]) and _number(a["distance"]) for a in v["answers"])
            and (t is None or (_number(t["loss"]) and _number(t["accuracy"]) and _number(t["tokens"])
                               and all(_number(b) for b in t["block_losses"])))
            and _number(v["prefill_s"]) and _number(v["peak_rss_mb"], none=True) and _number(v["decode_tokens"])
            and _number(v["decode_s"]) and _number(v.get("seconds", 0.0))
            and (v.get("loadavg") is None or _number(v["loadavg"][0], none=True))
            and _number(v.get("gflops"), none=True))


def haystack_of(name: str, tokenizer):
    """The haystack ``name`` under ``tokenizer``, tokenized once while the run's tokenizer stays the same object
    (:func:`new_run` forgets them)."""
    got = _HAYSTACKS.get(name)
    if got is None or got[0] is not tokenizer:
        got = _HAYSTACKS[name] = (tokenizer, make_haystack(name, tokenizer))
    return got[1]


def new_run() -> None:
    """Forget the haystacks of an earlier run (another tokenizer, perhaps)."""
    _HAYSTACKS.clear()


def _one(store, key: dict, model, m, spec, seed: int, length: int, chat: bool) -> dict:
    haystack = haystack_of(spec.haystack, m.tokenizer)
    ctx = build_context(m.tokenizer, haystack, length, spec.generators, seed, spec.target, chat, spec.options,
                        spec.reach)
    ctx.check(m.tokenizer)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t = time.perf_counter()
    value = run_context(model, m.tokenizer, ctx)
    value.update({"seconds": time.perf_counter() - t, "loadavg": [load, os.getloadavg()[0] if load is not None
                                                                  else None]})
    store.put(key, value)
    return value


_HAYSTACKS: dict = {}  # haystack name -> (the tokenizer, the haystack it tokenized)


def _summary(v: dict) -> str:
    hits = sum(a["correct"] for a in v["answers"])
    ppl = f", target ppl {2.718281828 ** v['target']['loss']:.1f}" if v.get("target") else ""
    return f"prefill {v['prefill_s']:.0f}s, {hits}/{len(v['answers'])} answers right{ppl}"


def run_cells(preset, m, store, *, progress: bool, log: Callable[[str], None], pruned,
              missing: dict[str, int] | None = None) -> dict[str, str]:
    """Run every unfinished cell of ``preset`` (``m``: the loaded model, :class:`posenc.evals.suite.spec.ModelFacts`);
    returns ``{"method@length": reason}`` for the (method, length) pairs left out.

    ``missing``: run nothing; count the unfinished cells of every (method, length) pair that is not left out into it
    (``{"method@length": cells}``), for a report of a run that is not finished."""
    from tqdm import tqdm

    from posenc.evals.suite.spec import cell_key, cell_row, plan

    cells = plan(preset)
    bar = tqdm(total=sum(_weight(n) for n, *_ in cells), disable=not progress, unit="cost",
               bar_format="{l_bar}{bar}| {elapsed}<{remaining} {postfix}")
    skipped: dict[str, str] = {}
    done = 0
    emit = bar.write if progress else log  # lines above the bar, not through it
    try:
        by_pair: dict[tuple[int, str], list] = {}
        for n, method, spec, seed in cells:
            by_pair.setdefault((n, method), []).append((spec, seed))
        for (n, method), todo in by_pair.items():
            row, params = cell_row(method, m.train_len, n, m.head_dim, m.base, preset.params)
            keys = [(cell_key(m.model_id, row, params, n, spec, s, preset.chat, device=m.device, dtype=m.dtype),
                     spec, s) for spec, s in todo]
            pending = [(k, spec, s) for k, spec, s in keys if store.get(k) is None]
            why = pruned(store, m, preset, method, n) if pending else None
            if missing is not None and pending and not why:
                missing[f"{method}@{n}"] = len(pending)
                pending = []
            if why:
                skipped[f"{method}@{n}"] = why
                emit(f"{method} at {n}: left out ({why})")
            model = m.fresh(row, params) if pending and not why else None
            for k, spec, s in keys:
                done += 1
                bar.set_postfix_str(f"cell {done}/{len(cells)}: {method} @ {n} {spec.name} seed {s}")
                if model is not None and store.get(k) is None:
                    v = _one(store, k, model, m, spec, s, n, preset.chat)
                    emit(f"[{done}/{len(cells)}] {method} @ {n} {spec.name} seed {s}: {_summary(v)}")
                bar.update(_weight(n))
            del model
    finally:
        bar.close()
    return skipped
