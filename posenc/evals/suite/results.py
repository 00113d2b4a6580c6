"""From finished cells to ``results.json``: one record per (method, length), retrieval records by needle depth,
effective lengths, and the report (:mod:`posenc.evals.report.suite`).

Per (method, length), in the lab's records schema (:class:`posenc.evals.records.EvalRecord`; ``scheme`` is the
model's name, ``passkey`` the pass-key accuracy):

- ``ppl``/``loss``/``accuracy``: the target passages of the book contexts every row runs (the same tokens at
  every length and row: :func:`shared_cells`), geometric mean over seeds; ``ppl_interval``: 95% t interval over the
  passages' 64-token blocks; ``passages``: every passage's loss, those of contexts run for some rows only
  (:attr:`posenc.evals.suite.spec.ContextSpec.methods`) too, paired by name in ``ppl_ratio``/``ppl_vs``;
- ``tasks``: per query kind, ``k`` right of ``n``, Wilson 95% interval, chance;
- ``retrieval``: the *informative* retrieval kinds pooled, the score effective length is judged on, with its
  Wilson interval. A retrieval kind (``passkey``, ``niah_mk``, ``niah_mq``, ``niah_mv``) is informative when the
  untouched model solves it above chance at the reference length (the lower end of its Wilson interval above the
  chance level): a task the model cannot do within its trained context says nothing about losing context, and
  pooled in it would only add noise (:func:`informative_kinds`; ``reference.kinds`` names them);
- cost: ``prefill_s`` (mean seconds per prefill), ``peak_rss_mb`` (largest process peak during a prefill),
  ``decode_tok_s`` (tokens per second while answering), ``loadavg`` (the machine's 1-minute load), ``gflops``
  (the machine's matmul speed probed at the cells' starts: :func:`machine_speed`).

Paired differences (``comparisons``, when the preset names ``compare_to`` rows): past the trained length, every
row against each of those rows on the queries both answered (the same contexts, seeds and needles: a query is its
context, seed and place in the cell), informative kinds only, with Newcombe's paired 95% interval
(:func:`posenc.evals.stats.intervals.paired_difference`). Pairing is what makes n = 4 say anything: two rows that
miss the same needle differ by nothing on it.

Retrieval records (:class:`posenc.evals.records.RetrievalRecord`): per query kind, method, length and depth fifth,
with the mean needle distance. ``effective``: per method the longest length whose retrieval stays at or above
``threshold`` x the untouched model's retrieval at ``reference_length``
(:func:`posenc.tasks.score.effective_length`).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from posenc.tasks.ruler import QUERY_KINDS, RETRIEVAL_KINDS

__all__ = ["MACHINE_FIELDS", "aggregate", "informative_kinds", "machine_speed", "paired_differences",
           "write_results"]
DEPTH_BINS = 5

MACHINE_FIELDS = ("prefill_s", "decode_tok_s", "loadavg", "peak_rss_mb", "gflops")
"""The fields of a record that the machine and the moment set: two runs of the same cells differ in these only."""


def _interval(k: int, n: int) -> dict:
    from posenc.evals.stats.intervals import wilson

    i = wilson(k, n)
    return {"k": k, "n": n, "value": i.value if n else None, "lo": i.lo if n else None, "hi": i.hi if n else None}


def _cells_of(store, m, preset, method: str, n: int) -> list[tuple]:
    from posenc.evals.suite.spec import cell_key, cell_row

    row, params = cell_row(method, m.train_len, n, m.head_dim, m.base, preset.params)
    out = []
    for spec in preset.contexts:
        if not spec.used_at(n, method):
            continue
        for s in spec.seed_range:
            v = store.get(cell_key(m.model_id, row, params, n, spec, s, preset.chat, device=m.device,
                                   dtype=m.dtype))
            if v is not None:
                out.append((spec, s, v))
    return out


def task_counts(answers: list[dict]) -> dict:
    """Per query kind: ``k`` right of ``n`` with its Wilson interval and the chance level."""
    tasks = {}
    for kind in QUERY_KINDS:
        got = [a for a in answers if a["kind"] == kind]
        if got:
            tasks[kind] = {**_interval(sum(a["correct"] for a in got), len(got)), "chance": got[0]["chance"]}
    return tasks


def informative_kinds(reference_tasks: dict) -> tuple[str, ...]:
    """The retrieval kinds the untouched model solves above chance at the reference length (Wilson lower end >
    chance); all retrieval kinds present when none is (the report then says effective length means nothing)."""
    good = tuple(k for k in RETRIEVAL_KINDS if k in reference_tasks and reference_tasks[k]["n"]
                 and reference_tasks[k]["lo"] > reference_tasks[k]["chance"])
    return good or tuple(k for k in RETRIEVAL_KINDS if k in reference_tasks)


def pooled(tasks: dict, kinds) -> dict:
    """``k``/``n`` and Wilson interval of ``kinds`` pooled."""
    k = sum(tasks[x]["k"] for x in kinds if x in tasks)
    return _interval(k, sum(tasks[x]["n"] for x in kinds if x in tasks))


def key_bins_of(preset) -> list[list[int]] | None:
    """The distance bins of the preset's ``keys`` contexts (sized: :meth:`posenc.evals.suite.spec.SuitePreset.sized`),
    None when it has none."""
    return next((spec.options["keys"]["bins"] for spec in preset.contexts if "keys" in spec.generators
                 and "bins" in spec.options.get("keys", {})), None)


def mark_other_key(cells: list[tuple]) -> list[dict]:
    """The answers of ``cells`` (``(spec, seed, value)``), each ``niah_keys`` answer with ``other_key``: for a wrong
    answer, whether its digits are those of a key answered correctly in the same prefill (the model gave another
    key's value: confusion between labels, not a lost needle; a lower bound, since two wrong answers of one prefill
    cannot be told apart). The stored values are not changed."""
    out = []
    for _, _, v in cells:
        keys = [a for a in v["answers"] if a["kind"] == "niah_keys"]
        right = {_digits(a["answer"]) for a in keys if a["correct"]} - {""}
        out += [{**a, "other_key": not a["correct"] and _digits(a["answer"]) in right}
                if a["kind"] == "niah_keys" else a for a in v["answers"]]
    return out


def _digits(text) -> str:
    return "".join(ch for ch in str(text or "") if ch.isdigit())


def by_bin(answers: list[dict], bins) -> list[dict]:
    """Accuracy of the ``niah_keys`` answers per distance bin (tokens back): ``lo``/``hi`` the bin's edges,
    ``k`` of ``n`` and the Wilson interval as ``interval``, ``distance`` the mean distance back, ``other_key`` how
    many of the bin's wrong answers gave another key's value (answers marked by :func:`mark_other_key`; 0 without
    the mark)."""
    from posenc.tasks.ruler import bin_of

    out = []
    keys = [a for a in answers if a["kind"] == "niah_keys"]
    for i, (lo, hi) in enumerate(bins or []):
        sel = [a for a in keys if bin_of(a["distance"], bins) == i]
        if sel:
            out.append({"bin": i, "from": lo, "to": hi, "distance": round(statistics.fmean(a["distance"] for a in sel)),
                        "interval": _interval(sum(a["correct"] for a in sel), len(sel)),
                        "other_key": sum(bool(a.get("other_key")) for a in sel)})
    return out


def passage_losses(cells: list[tuple]) -> dict[str, float]:
    """Mean target loss per passage (``"<context>/<seed>"``: the same tokens at every length and method)."""
    return {f"{spec.name}/{s}": v["target"]["loss"] for spec, s, v in cells if v.get("target")}


def shared_cells(cells: list[tuple]) -> list[tuple]:
    """The cells of the contexts every row runs (:attr:`posenc.evals.suite.spec.ContextSpec.methods` None): a row's
    perplexity, accuracy and interval are over these, so that they compare the same passages across rows; the
    passages of contexts run for some rows only count in the paired ratios (:func:`ppl_ratio`)."""
    return [c for c in cells if c[0].methods is None]


def ppl_ratio(losses: dict[str, float], reference: dict[str, float]) -> dict | None:
    """The paired perplexity ratio of a row to a reference row over the passages both scored: the geometric mean of
    the per-passage ratios with Student's t 95% interval over passages (``value``/``lo``/``hi``; NaN ends for one
    passage), ``n`` passages; None when they share none."""
    from posenc.evals.stats.intervals import mean_interval

    both = sorted(set(losses) & set(reference))
    if not both:
        return None
    i = mean_interval([losses[p] - reference[p] for p in both], over="passages")
    return {"value": math.exp(i.value), "lo": math.exp(i.lo) if i.known else None,
            "hi": math.exp(i.hi) if i.known else None, "n": len(both)}


def machine_speed(cells: list[tuple]) -> dict | None:
    """The lowest and highest matmul GFLOP/s probed at the starts of ``cells`` (``gflops`` of
    :func:`posenc.evals.suite.prefill.run_context`) and how many cells recorded one; None when none did."""
    got = [v["gflops"] for _, _, v in cells if v.get("gflops") is not None]
    return {"lo": min(got), "hi": max(got), "cells": len(got)} if got else None


def _record(name: str, m, preset, method: str, n: int, cells: list[tuple], kinds) -> dict:
    """The EvalRecord row of one (method, length)."""
    from posenc.evals.records import EvalRecord
    from posenc.evals.stats.intervals import ppl_interval
    from posenc.evals.suite.spec import method_params

    answers = [a for _, _, v in cells for a in v["answers"]]
    targets = [v["target"] for _, _, v in shared_cells(cells) if v.get("target")]
    tasks = task_counts(answers)
    loss = statistics.fmean(t["loss"] for t in targets) if targets else None
    blocks = [b for t in targets for b in t["block_losses"]]
    pk = tasks.get("passkey")
    decode_s = sum(v["decode_s"] for _, _, v in cells)
    extra = {"retrieval": pooled(tasks, kinds), "tasks": tasks,
             "ppl_interval": ppl_interval(blocks, over="64-token blocks").to_dict() if len(blocks) > 1 else None,
             "prefill_s": statistics.fmean(v["prefill_s"] for _, _, v in cells),
             "peak_rss_mb": max((v["peak_rss_mb"] or 0) for _, _, v in cells) or None,
             "decode_tok_s": sum(v["decode_tokens"] for _, _, v in cells) / decode_s if decode_s else None,
             "loadavg": statistics.fmean(v["loadavg"][0] for _, _, v in cells if v.get("loadavg", [None])[0]
                                         is not None) if any(v.get("loadavg") for _, _, v in cells) else None,
             "gflops": machine_speed(cells),
             "cells": len(cells), "by_bin": by_bin(mark_other_key(cells), key_bins_of(preset)),
             "passages": passage_losses(cells)}
    rec = EvalRecord(scheme=name, method=method, train_len=m.train_len, eval_len=n,
                     ppl=math.exp(loss) if loss is not None else None, loss=loss,
                     accuracy=statistics.fmean(t["accuracy"] for t in targets) if targets else None,
                     tokens=sum(t["tokens"] for t in targets), passkey=pk["value"] if pk else None,
                     params=method_params(method, m.train_len, n, m.head_dim, m.base, preset.params), extra=extra)
    return rec.to_dict()


def _depth_records(name: str, m, method: str, n: int, cells: list[tuple]) -> list[dict]:
    """Retrieval records per query kind and depth fifth."""
    from posenc.evals.records import RetrievalRecord

    out = []
    for kind in QUERY_KINDS:
        got = [a for _, _, v in cells for a in v["answers"] if a["kind"] == kind]
        for b in range(DEPTH_BINS):
            sel = [a for a in got if min(int(a["depth"] * DEPTH_BINS), DEPTH_BINS - 1) == b]
            if not sel:
                continue
            k = sum(a["correct"] for a in sel)
            dist = max(1, min(n - 1, round(statistics.fmean(a["distance"] for a in sel))))
            iv = _interval(k, len(sel))
            out.append(RetrievalRecord(kind, name, method, m.train_len, n, dist, k / len(sel), len(sel),
                                       sel[0]["chance"], extra={"depth_bin": [b / DEPTH_BINS, (b + 1) / DEPTH_BINS],
                                                                "lo": iv["lo"], "hi": iv["hi"]}).to_dict())
    return out


def _queries(cells: list[tuple], kinds) -> dict[tuple, dict]:
    """The informative answers of a row's cells keyed by query: (context, seed, place in the cell)."""
    return {(spec.name, s, i): a for spec, s, v in cells for i, a in enumerate(v["answers"])
            if a["kind"] in kinds}


def paired_differences(preset, m, store, kinds) -> list[dict]:
    """Per length past the trained one, each row against each ``preset.compare_to`` row: ``value`` = the row's
    retrieval minus the other's over the queries both answered, ``lo``/``hi`` Newcombe's paired interval, ``n``
    the pairs, ``wins``/``losses`` the queries only the row / only the other got right."""
    from posenc.evals.stats.intervals import paired_difference

    out = []
    for n in sorted(x for x in preset.lengths if x > m.train_len):
        rows = {method: _queries(_cells_of(store, m, preset, method, n), kinds) for method in preset.methods}
        for versus in preset.compare_to:
            for method in preset.methods:
                if method == versus or not rows[method] or not rows[versus]:
                    continue
                both = sorted(set(rows[method]) & set(rows[versus]))
                for q in both:
                    if rows[method][q]["depth"] != rows[versus][q]["depth"]:
                        raise ValueError(f"query {q} of {method} and {versus} at {n} hides its needle at different "
                                         "depths: the cells do not hold the same contexts")
                a = [rows[method][q]["correct"] for q in both]
                b = [rows[versus][q]["correct"] for q in both]
                d = paired_difference(a, b)
                out.append({"length": n, "method": method, "versus": versus, "n": d.n, "value": d.value,
                            "lo": d.lo if d.n else None, "hi": d.hi if d.n else None,
                            "wins": sum(x and not y for x, y in zip(a, b)),
                            "losses": sum(y and not x for x, y in zip(a, b))})
    return out


def _lengths_of(method: str, pairs) -> list[int]:
    """The lengths of ``method`` among ``"method@length"`` keys (a row label may hold ``@`` itself)."""
    return sorted(int(n) for label, n in (k.rsplit("@", 1) for k in pairs) if label == method)


def aggregate(preset, m, store, *, skipped: dict, name: str, missing: dict[str, int] | None = None) -> dict:
    """``{"records", "retrieval", "effective", "reference", "comparisons"}`` from the finished cells."""
    from posenc.tasks.score import effective_length

    base = preset.methods[0]  # the untouched model
    ref_cells = _cells_of(store, m, preset, base, preset.reference_length)
    kinds = preset.retrieval_kinds or informative_kinds(task_counts([a for _, _, v in ref_cells
                                                                      for a in v["answers"]]))
    records, retrieval = [], []
    for method in preset.methods:
        for n in sorted(preset.lengths):
            cells = _cells_of(store, m, preset, method, n)
            if cells:
                records.append(_record(name, m, preset, method, n, cells, kinds))
                retrieval += _depth_records(name, m, method, n, cells)
    ref_rec = next((r for r in records if r["method"] == base and r["eval_len"] == preset.reference_length), None)
    ref = ref_rec["retrieval"]["value"] if ref_rec else None
    threshold = preset.threshold * ref if ref is not None else None
    effective = {}
    for method in preset.methods:
        scores = {r["eval_len"]: r["retrieval"]["value"] for r in records if r["method"] == method}
        left_out = _lengths_of(method, skipped)
        unfinished = _lengths_of(method, missing or {})
        eff = effective_length(scores, threshold) if threshold is not None and scores else None
        effective[method] = {"effective_length": eff, "scores": {str(k): v for k, v in sorted(scores.items())},
                             "left_out": left_out, "unfinished": unfinished,
                             "complete": not left_out and not unfinished and len(scores) == len(preset.lengths)}
    reference = {"method": base, "length": preset.reference_length, "retrieval": ref, "kinds": list(kinds),
                 "fraction": preset.threshold, "threshold": threshold}
    out = {"records": records, "retrieval": retrieval, "effective": effective, "reference": reference,
           "comparisons": paired_differences(preset, m, store, kinds)}
    if preset.retrieval_kinds is not None:  # the interval rule (posenc.evals.suite.verdict)
        out.update(_judged(preset, m, records, effective, reference, ref_rec))
    return out


def _judged(preset, m, records: list[dict], effective: dict, reference: dict, ref_rec: dict | None) -> dict:
    """The verdicts of the interval rule (:func:`posenc.evals.suite.verdict.judge`): each record gets its paired
    perplexity ratios (``ppl_ratio`` to the untouched model at the reference length, ``ppl_vs`` to each
    ``compare_to`` row at the same length), ``effective`` takes the rule's effective lengths, the reference its
    interval and floor. Below the floor nothing is judged (``verdicts`` empty, effective lengths None)."""
    from posenc.evals.suite.verdict import judge

    by = {(r["method"], r["eval_len"]): r for r in records}
    ref_iv = ref_rec["retrieval"] if ref_rec else {"n": 0}
    ref_losses = (ref_rec or {}).get("passages", {})
    for r in records:
        r["ppl_ratio"] = ppl_ratio(r["passages"], ref_losses)
        r["ppl_vs"] = {v: ppl_ratio(r["passages"], by[(v, r["eval_len"])]["passages"]) for v in preset.compare_to
                       if v != r["method"] and (v, r["eval_len"]) in by}
    below = preset.floor is not None and (not ref_iv.get("n") or ref_iv["value"] < preset.floor)
    reference.update({"interval": ref_iv, "floor": preset.floor, "below_floor": below, "rule": "interval",
                      "ppl_bound": preset.ppl_bound})
    verdicts = {}
    for method in preset.methods:
        rows = {n: {"retrieval": r["retrieval"], "ppl_ratio": r["ppl_ratio"]} for (mm, n), r in by.items()
                if mm == method}
        if rows and not below:
            verdicts[method] = judge(rows, ref_iv, m.train_len, preset.ppl_bound)
        effective[method]["effective_length"] = verdicts[method]["effective_length"] if method in verdicts else None
    return {"verdicts": verdicts}


def same_as_untouched(preset, m) -> list[str]:
    """``method@length`` of the rows whose parameters are the identity at that length
    (:func:`posenc.evals.suite.spec.cell_row`): they share the untouched model's cells there."""
    from posenc.evals.suite.spec import cell_row

    return [f"{method}@{n}" for method in preset.methods[1:] for n in sorted(preset.lengths)
            if cell_row(method, m.train_len, n, m.head_dim, m.base, preset.params)[0] != method]


def write_results(preset, m, store, out: Path, *, skipped: dict, machine: dict, run_seconds: float,
                  missing: dict[str, int] | None = None) -> dict:
    """Aggregate, then write ``results.json`` and the report into ``out`` (atomically). Returns the results.

    ``missing``: ``{"method@length": unfinished cells}`` of a report written before the run finished
    (``meta["complete"]`` is False while any is left)."""
    from posenc.evals.report.suite import write_report
    from posenc.evals.suite.spec import cell_row
    from posenc.hf.source import describe_source
    from posenc.runtime.atomic import atomic_write_bytes

    # a bundled name as it is; a path by its folder or file name (the model id is a digest, for cell keys)
    name = preset.model if isinstance(preset.model, str) and "/" not in preset.model else Path(str(preset.model)).name
    body = aggregate(preset, m, store, skipped=skipped, name=name, missing=missing)
    cells, seen = [], set()  # this preset's (a shared store holds others), a cell shared by two rows once
    for method in preset.methods:
        for n in sorted(preset.lengths):
            row, params = cell_row(method, m.train_len, n, m.head_dim, m.base, preset.params)
            if (tag := (row, json.dumps(params, sort_keys=True, default=str), n)) not in seen:
                seen.add(tag)
                cells += [v for _, _, v in _cells_of(store, m, preset, method, n)]
    total = sum(v.get("seconds", 0.0) for v in cells)
    meta = {"kind": "suite", "preset": preset.name, "description": preset.description,
            "model": describe_source(preset.model),
            "model_id": m.model_id, "train_len": m.train_len, "device": m.device, "dtype": m.dtype,
            "config": preset.to_dict(), "machine": machine,
            "left_out": skipped, "missing": dict(missing or {}), "complete": not missing, "cells": len(cells),
            "cell_seconds_total": round(total, 1), "this_sitting_seconds": round(run_seconds, 1),
            "same_as_untouched": same_as_untouched(preset, m)}
    results = {"meta": meta, **body}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "results.json", json.dumps(results, indent=1, default=str).encode())
    write_report(results, out)
    return results
