"""Two models' suite runs side by side: the same methods at the same multiples of each model's trained length.

A method's answer on one model is a claim about that model. Set beside another model's run, read at the same
multiples ``f x L`` of *its own* trained length ``L`` (SmolLM2 at 8k, 16k, 32k beside Gemma 3 at 32k, 64k, 128k), the
table shows whether an answer travels: per method present in every run, the keys found at each multiple (``k/n`` with
the Wilson 95% interval) and the run's verdict, each under the rule its run was judged by (stated under the table:
the interval rule of :mod:`posenc.evals.suite.verdict`, or an earlier run's threshold rule,
:func:`posenc.evals.report.suite.verdict`). Nothing is typed by hand: every cell is read from the runs'
``results.json``; ``tests/repo/test_suite_readme.py`` checks the committed blocks against this rendering.
"""

from __future__ import annotations

from posenc.evals.report.suite import Table, _k, verdict
from posenc.evals.report.suite_answer import verdict_text

__all__ = ["MARKS", "block", "rule_line", "table"]

#: a page holds the rendering of runs ``a,b`` between these marks
MARKS = ("<!-- side-by-side:{names}:begin -->", "<!-- side-by-side:{names}:end -->")
FACTORS = (1, 2, 4)


def _short(results: dict) -> str:
    """The model's bundled name (``smollm2`` of ``"smollm2: SmolLM2-135M-Instruct ..."``)."""
    return str(results["meta"].get("model", "?")).split(":", 1)[0]


def _judged(results: dict) -> bool:
    return (results.get("reference") or {}).get("rule") == "interval"


def _records(results: dict) -> dict:
    return {(r["method"], r["eval_len"]): r for r in results["records"]}


def _keys(rec: dict | None) -> str:
    iv = (rec or {}).get("retrieval") or {}
    if not iv.get("n"):
        return "-"
    return f"{iv['k']}/{iv['n']} ({iv['value']:.2f} [{iv['lo']:.2f}, {iv['hi']:.2f}])"


def _verdict(results: dict, method: str) -> str:
    if _judged(results):
        v = (results.get("verdicts") or {}).get(method)
        return verdict_text(v) if v else "-"
    return verdict(results, method)


def methods_in_all(runs: list[dict]) -> list[str]:
    """The methods every run has a record of, in the first run's order."""
    first = list(dict.fromkeys(r["method"] for r in runs[0]["records"]))
    return [m for m in first if all(any(r["method"] == m for r in run["records"]) for run in runs[1:])]


def table(runs: list[dict], factors=FACTORS) -> Table:
    """Per method in every run: each run's keys at ``f x L`` for each factor, then its verdict."""
    header, cols = ["method"], []
    for run in runs:
        L = run["meta"]["train_len"]
        header += [f"{_short(run)}: keys at {_k(f * L)}" + (" (L)" if f == 1 else f" ({f}L)") for f in factors]
        header.append(f"{_short(run)}: verdict")
        cols.append((run, L, _records(run)))
    rows = []
    for m in methods_in_all(runs):
        cells = [m]
        for run, L, by in cols:
            cells += [_keys(by.get((m, f * L))) for f in factors]
            cells.append(_verdict(run, m))
        rows.append(tuple(cells))
    return Table(tuple(header), tuple(rows))


def rule_line(results: dict) -> str:
    """How the run's verdicts were reached, with its reference, in one sentence."""
    ref = results.get("reference") or {}
    name, L = _short(results), _k(results["meta"]["train_len"])
    if _judged(results):
        iv = ref.get("interval") or {}
        return (f"{name} (trained at {L}): the interval rule, against the untouched model's "
                f"{iv.get('k')}/{iv.get('n')} [{iv.get('lo', 0):.2f}, {iv.get('hi', 0):.2f}] at {L} "
                "and a perplexity bound.")
    return (f"{name} (trained at {L}): an earlier run's threshold rule, a length kept while the keys found reach "
            f"{ref.get('fraction')} x the untouched model's {ref.get('retrieval', 0):.2f} at {L} (point estimates).")


def block(runs: list[dict], names: list[str]) -> str:
    """The page's copy for the committed runs ``names`` (their results ``runs``), between :data:`MARKS`."""
    begin, end = (m.format(names=",".join(names)) for m in MARKS)
    lines = [begin, "", table(runs).markdown(), ""]
    lines += [f"- {rule_line(run)}" for run in runs]
    return "\n".join(lines + ["", end])
