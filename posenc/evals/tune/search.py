"""``posenc tune``: choose and fit the length extension of a user's model, then save it where engines read it.

:func:`tune` spends a budget of forward passes (prefills of one context each) on the suite objective
(:class:`posenc.evals.tune.objective.TuneObjective`) at the target length:

1. the untouched model (the reference row), then a grid over the methods and their parameters
   (:func:`method_candidates`: every method's defaults first, then, in turn, each parameter of the method's
   per-length defaults
   :func:`posenc.methods.length_defaults`, and a few multiples of it: YaRN's and PI's factor, SelfExtend's
   group and window, DCA's chunk, ...);
2. with the rest of the budget, LongRoPE's evolutionary search of per-dimension factors
   (:func:`posenc.evals.tune.factors.evolve`), initialised from PI, NTK and YaRN, with the monotonicity constraint;
3. a ranked table (score, loss with its t interval, retrieval with its Wilson interval) and a
   recommendation: the best score.

The winner is saved in the most portable form (:func:`save_winner`): a method transformers implements (PI as
``linear``, YaRN, LongRoPE, ...) as a plain transformers folder whose ``config.json`` carries ``rope_parameters``
(transformers, vLLM, SGLang load it without posenc) plus the same schedule as llama.cpp GGUF keys
(:mod:`posenc.evals.tune.gguf_rope`); a method only posenc's engine runs as posenc's extension
(:func:`posenc.hf.patch.save`), with the reason no native candidate matched it.

The budget counts every (candidate, context) prefill, a refused candidate's included (the cells it stored before it
was refused). Every evaluated (candidate, context) is a cell in ``out/cells`` (resumable; a finished cell is never
recomputed; a damaged one is computed again), the output folder and its cells folder are locked while a tune writes
them, and ``results.json`` / ``report.md`` are written atomically. SIGINT or SIGTERM stops a tune at once with one
line naming the cells folder (a cell in flight is computed again on resume; every written one is whole).

``out`` is checked before the model is loaded (:func:`posenc.evals.results_folder.check_results_folder`): a new or
empty folder, or the folder of an earlier tune of the same model at the same length, which the tune resumes and
whose results and winner it then replaces; a file, another kind of run's results, another tune's, or files a tune
does not write are refused in one line. So are settings that cannot run (``--length`` not past the trained length,
``--target`` below 1, ``--length`` too short for the contexts and ``--target``), before anything is written.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

__all__ = ["DEFAULT_METHODS", "method_candidates", "ranked_table", "save_winner", "tune"]

DEFAULT_METHODS = ("pi", "ntk", "yarn", "selfextend", "dca")
# multiples of a per-length default tried for each parameter (by parameter name; others keep their default)
_VARY = {"factor": (1.0, 1.5), "group": (1.0, 2.0), "window": (1.0, 0.5), "chunk": (1.0, 0.5),
         "local_window": (1.0,), "base": (1.0, 2.0)}


def method_candidates(methods, train_len: int, length: int, head_dim: int, base: float) -> list[tuple[str, dict]]:
    """``(method, params)`` for each method of ``methods`` and each combination of its per-length defaults times
    the multiples of ``_VARY`` (integers rounded; duplicates dropped). Every method's defaults come first, then the
    variations, one method's at a time in turn, so a budget that ends inside the grid has tried every method."""
    from posenc.methods import length_defaults

    per_method: list[list[tuple[str, dict]]] = []
    for m in methods:
        d = length_defaults(m, train_len, length, head_dim=head_dim, base=base)
        keys = sorted(d)
        grids = []
        for k in keys:
            v = d[k]
            mults = _VARY.get(k, (1.0,)) if isinstance(v, (int, float)) and not isinstance(v, bool) else (1.0,)
            vals = []
            for f in mults:
                x = v if f == 1.0 else (max(1, int(round(v * f))) if isinstance(v, int) else round(v * f, 4))
                if x not in vals:
                    vals.append(x)
            grids.append(vals)
        per_method.append([(m, dict(zip(keys, combo))) for combo in itertools.product(*grids)])
    out: list[tuple[str, dict]] = []
    for cand in itertools.chain.from_iterable(itertools.zip_longest(*per_method)):
        if cand is not None and cand not in out:
            out.append(cand)
    return out


def _longrope_params(lam, factor: float, head_dim: int) -> dict:
    return {"short_factor": [1.0] * (head_dim // 2), "long_factor": [float(x) for x in lam], "factor": float(factor)}


def ranked_table(rows: list[dict]) -> str:
    """The rows (best score first) as a Markdown table with the intervals."""
    def iv(r, k):
        lo, hi = r.get(f"{k}_lo"), r.get(f"{k}_hi")
        return "" if lo is None or hi is None else f" [{lo:.2f}, {hi:.2f}]"

    lines = ["| rank | method | params | score | loss [95% t] | ppl | retrieval [95% Wilson] |",
             "|---:|---|---|---:|---|---:|---|"]
    for i, r in enumerate(rows, 1):
        p = r.get("label") or _short(r["params"])
        lines.append(f"| {i} | {r['method']} | {p} | {r['score']:.3f} | {r['loss']:.3f}{iv(r, 'loss')} | "
                     f"{r['ppl']:.2f} | {r['retrieval']:.2f}{iv(r, 'retrieval')} (n={r['queries']}) |")
    return "\n".join(lines)


def _short(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items())) or "-"


def _is_native(method: str) -> bool:
    from posenc.methods import parse_methods

    recs = parse_methods(method, hf=True)
    return len(recs) == 1 and bool(recs[0].hf_native)


def save_winner(objective, rows: list[dict], out: Path) -> dict:
    """Save the best row (module docstring): ``{"form": "native" | "engine" | "none", "path", "gguf", "reason"}``."""
    import json

    import torch

    from posenc.hf.patch import extend, load, save
    from posenc.methods import is_identity

    if not rows:
        raise ValueError("no candidate was evaluated: nothing to save")
    best = rows[0]
    if is_identity(best["method"]):
        _drop_earlier_winner(out)
        return {"form": "none", "path": None, "gguf": None,
                "reason": "no candidate scored better than the untouched model; nothing to save"}
    model = extend(load(objective.facts.folder, dtype=torch.float32), best["method"], **best["params"])
    folder = save(model, out / "model", tokenizer=objective.facts.tokenizer, replace=True)  # this tune's own folder
    if _is_native(best["method"]):
        from posenc.evals.tune.gguf_rope import SCALED_TYPES, write_rope_gguf

        config = json.loads((folder / "config.json").read_text())
        gguf_path = None
        if (config.get("rope_parameters") or {}).get("rope_type") in SCALED_TYPES:
            gguf_path = str(write_rope_gguf(out / "rope.gguf", config))  # replaces an earlier one whole, or keeps it
        else:
            (out / "rope.gguf").unlink(missing_ok=True)  # an earlier run's keys do not describe this winner
        return {"form": "native", "path": str(folder), "gguf": gguf_path,
                "reason": "transformers implements the method: plain rope_parameters, loadable without posenc"}
    (out / "rope.gguf").unlink(missing_ok=True)  # an engine winner has no GGUF rope keys
    natives = [r for r in rows if _is_native(r["method"])]
    why = ("no native candidate was evaluated" if not natives else
           f"the best native candidate, {natives[0]['method']} ({_short(natives[0]['params'])[:80]}), scored "
           f"{natives[0]['score']:.3f} against the winner's {best['score']:.3f}")
    return {"form": "engine", "path": str(folder), "gguf": None,
            "reason": f"{best['method']} runs only on posenc's engine (saved as posenc's extension): {why}"}


def _drop_earlier_winner(out: Path) -> None:
    """Remove what an earlier tune into ``out`` saved (``model/``, ``rope.gguf``), so the folder holds what this
    run's results say (its winner is the untouched model: nothing saved)."""
    import shutil

    shutil.rmtree(out / "model", ignore_errors=True)
    (out / "rope.gguf").unlink(missing_ok=True)


class _Spent:
    """Forward passes counted against the budget (``n``) and the progress bar with its ETA (a disabled tqdm
    counts nothing, so the count is kept here)."""

    def __init__(self, total: int, progress: bool):
        from tqdm.auto import tqdm

        self.n = 0
        self.bar = tqdm(total=total, disable=not progress, unit="fwd", desc="tune", dynamic_ncols=True)

    def update(self, k: int) -> None:
        self.n += k
        self.bar.update(k)

    def set_postfix_str(self, text: str) -> None:
        self.bar.set_postfix_str(text)

    def write(self, text: str) -> None:
        self.bar.write(text)

    def close(self) -> None:
        self.bar.close()


def _run_candidates(objective, cands, budget: int, bar, log) -> list[dict]:
    """Evaluate ``cands`` in order while their prefills fit in the budget (``bar.n``: prefills counted so far); a
    refused candidate counts the cells it stored (the same on a resume, where they are read back)."""
    rows = []
    per = len(objective.contexts)
    for method, params in cands:
        if bar.n + per > budget:
            log(f"budget reached: {method} {_short(params)[:60]} and later candidates left out")
            break
        try:
            row = objective.evaluate(method, params)
        except ValueError as exc:  # a parameter the method or model refuses
            spent = per - objective.pending(method, params)  # the prefills it ran (or stored before) count
            bar.update(spent)
            log(f"{method} {_short(params)[:60]}: refused ({exc})")
            continue
        rows.append(row)
        bar.update(per)
        bar.set_postfix_str(f"{method}: score {row['score']:.3f}")
    return rows


def tune(source, length: int, out, *, budget: int = 40, methods=DEFAULT_METHODS, longrope: bool = True,
         seed: int = 0, contexts=None, target: int = 256, weight: float = 1.0,
         population: int = 8, progress: bool = True, log: Callable[[str], None] = print, device="cpu",
         dtype="auto") -> dict:
    """Tune the extension of model ``source`` for ``length`` tokens into folder ``out`` (module docstring) with at
    most ``budget`` forward passes (one prefill of one context each). The budget counts every (candidate, context)
    evaluation, stored or not, so a resumed tune walks the same candidates (reading the stored ones) and ends with
    the same result as an uninterrupted one. ``device``/``dtype``: what the model runs on and with (``"auto"``:
    float32 on the CPU, bfloat16 on CUDA; :class:`~posenc.evals.tune.objective.TuneObjective`). Returns the
    results dict also written to ``out/results.json``: ``meta``, ``rows`` (best first), ``winner``, ``saved``."""
    from posenc._util import check_positive_int
    from posenc.evals.results_folder import check_results_folder
    from posenc.evals.tune.factors import INIT_RULES, evolve, initial_factors
    from posenc.evals.tune.objective import DEFAULT_CONTEXTS, TuneObjective
    from posenc.methods import NONE
    from posenc.runtime.atomic import atomic_write_json, atomic_write_text
    from posenc.runtime.interrupt import StopSignals
    from posenc.runtime.lock import FolderLock

    budget = check_positive_int("--budget", budget)
    target = check_positive_int("--target", target)
    out = Path(out)
    check_results_folder(out, "tune")  # a file, another run's results: refused before the model is loaded
    obj = TuneObjective(str(source), length, out / "cells", tuple(contexts or DEFAULT_CONTEXTS), target, weight,
                        device, dtype)
    f = obj.facts
    if length <= f.train_len:
        raise ValueError(f"--length {length} must be more than the model's trained length {f.train_len} (a tune "
                         "extends the model past it)")
    if budget < len(obj.contexts):
        raise ValueError(f"--budget must be >= {len(obj.contexts)} forward passes (one per context), got {budget}")
    for c in obj.contexts:  # every candidate prefills these: a setting that cannot build them is refused once
        try:
            obj._context(*c)
        except ValueError as exc:
            raise ValueError(f"--length {length} and --target {target}: no room for the {c[0]} context "
                             f"{c[1]}:{c[2]} ({exc}): give a larger --length or a smaller --target") from None
    check_results_folder(out, "tune", same={"model_id": f.model_id, "length": length})
    cells = Path(obj.cells)
    with ExitStack() as held:
        held.enter_context(FolderLock(out, what="tune", tidy=True))
        held.enter_context(FolderLock(cells, what="tune cells", tidy=True))
        held.enter_context(StopSignals(now=lambda sig: f"interrupted by {sig}: the finished cells are kept in "
                                                       f"{cells}; run the same command to continue from them"))
        check_results_folder(out, "tune", same={"model_id": f.model_id, "length": length})  # now that it is ours
        obj.store.remove_stale_temps()  # of writers killed in an earlier tune: no other writer while locked
        t0 = time.perf_counter()
        s = length / f.train_len
        bar = _Spent(budget, progress)
        emit = bar.write if progress else log
        grid = [(NONE.name, {})] + method_candidates(methods, f.train_len, length, f.head_dim, f.base)
        share = budget if not longrope else max(len(obj.contexts), budget // 2)
        rows = _run_candidates(obj, grid, share, bar, emit)
        if longrope and bar.n + len(obj.contexts) <= budget:
            init = {r: initial_factors(r, s, f.head_dim, f.base, f.train_len) for r in INIT_RULES}
            n_cand = (budget - bar.n) // len(obj.contexts)
            labels: dict[tuple, str] = {}

            def score(lam):
                row = obj.evaluate("longrope", _longrope_params(lam, s, f.head_dim))
                bar.update(len(obj.contexts))
                bar.set_postfix_str(f"longrope: score {row['score']:.3f}")
                rows.append(row)
                return row["score"]

            found = evolve(score, init, n_cand, max_factor=max(s, 2 * s), seed=seed, population=population,
                           on_eval=lambda name, lam, sc: labels.setdefault(tuple(lam.tolist()), name))
            for r in rows:
                if "long_factor" in r["params"]:
                    r["label"] = f"{labels.get(tuple(r['params']['long_factor']), 'searched')} factors"
            emit(f"longrope: {len(found)} factor vectors evaluated, best score {found[0]['score']:.3f}")
        bar.close()
        if not rows:
            raise ValueError("every candidate was refused (the reasons are above): nothing to rank or save")
        rows.sort(key=lambda r: r["score"])
        saved = save_winner(obj, rows, out)
        results = {"meta": {"kind": "tune", "model": str(source), "model_id": f.model_id, "train_len": f.train_len,
                            "length": length,
                            "device": obj.device, "dtype": obj.dtype, "budget_forwards": budget,
                            "forwards_run": obj.forwards, "seed": seed,
                            "contexts": [list(c) for c in obj.contexts], "target_tokens": target, "weight": weight,
                            "score": "loss + weight x (1 - retrieval)", "seconds": round(time.perf_counter() - t0, 1),
                            "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
                   "rows": rows, "winner": rows[0], "saved": saved}
        atomic_write_json(out / "results.json", results, indent=1)
        atomic_write_text(out / "report.md", _report(results))
        if progress:
            print(_report(results))
        return results


def _report(res: dict) -> str:
    m, w, s = res["meta"], res["winner"], res["saved"]
    label = w.get("label") or _short(w["params"])
    return "\n".join([
        f"# posenc tune: {m['model_id']} at {m['length']} tokens (trained at {m['train_len']})", "",
        f"{m['forwards_run']} forward passes run (budget {m['budget_forwards']}), {m['seconds']:.0f} s; "
        f"score = {m['score']} with weight {m['weight']}; contexts {m['contexts']}, {m['target_tokens']} target "
        f"tokens each.", "", ranked_table(res["rows"]), "",
        f"**Recommendation:** {w['method']} ({label[:120]}), score {w['score']:.3f}, "
        f"ppl {w['ppl']:.2f}, retrieval {w['retrieval']:.2f}", "",
        f"Saved ({s['form']}): {s['path'] or '-'}{' and ' + s['gguf'] if s.get('gguf') else ''}. {s['reason']}.", ""])
