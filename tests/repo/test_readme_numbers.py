"""Every number the README's "Latest results" and the results pages (docs/results/*.md) state is in a committed file.

Each block of those pages names its sources in an HTML comment, ``<!-- source: PATH [PATH ...] -->`` (paths under
``benchmarks/results/``); the block runs to the next such comment or to ``<!-- end source -->``. A results page
starts with one, so all of it is checked. The test reads every number of a block (prose and tables; code spans,
code blocks, links' targets, arXiv ids and numbers glued to a letter, such as ``8L``, ``16k`` or ``135M``, are
labels, not results) and requires a value in one of the block's source files that rounds to it at the printed
precision (``0.97`` matches 0.9688, ``1,154`` matches 1154.3; a percent, ``43.4%``, matches an accuracy 0.4339
and only a percent does; a minus sign not glued to a word, as in ``[-0.67, -0.02]``, is read with the number). The few
numbers that are not results and no source holds are in ``ALLOWED``, each with its reason.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]
SOURCE = re.compile(r"<!-- source: (.*?) -->")
END = "<!-- end source -->"
# not results, and in no source file: (page, the number as printed) -> why it is on the page
ALLOWED: dict[tuple[str, str], str] = {
    ("real-model-speed.md", "1.15"): "a goal of the issue that asked for the run (<= 1.15x), not a measurement",
    ("performance.md", "1020"): "the benchmark's configuration: StreamingLLM with 4 sinks + a 1020-token window",
    ("README.md", "1.25"): "the summary table's rule for 'keeps perplexity' (posenc.evals.report.suite.KEEPS_PPL)",
    ("which-method.md", "1.25"): "the same rule, stated with the verdicts (posenc.evals.report.choose)",
    ("which-method.md", "85.6%"): "RULER's fixed threshold (Llama-2-7B's score at 4k), cited beside the suite's rule",
    ("smollm2.md", "1.56"): "2^(20/31), NTK-aware's compression of dimension 20 at factor 2: a formula, not a result",
}

_STRIP = [re.compile(p, flags=re.S) for p in (
    r"<!--.*?-->", r"```.*?```", r"`[^`\n]*`", r"\]\([^)]*\)", r"https?://\S+",
    r"arXiv[ :]?\d{4}\.\d{4,5}", r"kexue\.fm/archives/\d+", r"\b[0-9a-f]{7,40}\b(?=[`)\s])")]
# a number: optional "x" before it (x2.7) or "x"/"%" after it (2.61x, 43.4%), not glued to a letter or digit
# a minus sign is part of the number when nothing word-like is glued before it ("[-0.67", " -0.42", "−0.3"); a hyphen
# glued to a number ("40-50", a range) is not a sign, and the number after it is not read
NUMBER = re.compile(
    r"(?:(?<![\w.^/-])([-\u2212])|(?<![\w.^/\u2212-]))x?((?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e[+-]?\d+)?)%?)x?"
    r"(?![\w]|\.\d)")
RAW = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def blocks(text: str) -> list[tuple[list[str], str]]:
    """``[(source paths, block text)]`` in page order; text outside any block is not returned."""
    out = []
    for m in SOURCE.finditer(text):
        start = m.end()
        nxt = [i for i in (text.find("<!-- source:", start), text.find(END, start)) if i >= 0]
        out.append((m.group(1).split(), text[start:min(nxt) if nxt else len(text)]))
    return out


def numbers(block: str) -> list[str]:
    """The numbers a block states, as printed (see the module docstring for what is skipped)."""
    for pattern in _STRIP:
        block = pattern.sub(" ", block)
    return [("-" if m.group(1) else "") + m.group(2) for m in NUMBER.finditer(block)]


def _bench_aggregates(data: dict) -> set[float]:
    """What a bench report derives from ``results.json``, computed the way the report does: mean recall over the
    needle distances at each length (all, within L, beyond L), each row's PPL(n)/PPL(L), and the headline table's
    ratio and far-needle accuracy with their 95% intervals (``posenc.evals.report.headline.headline``)."""
    from posenc.evals.report.headline import headline
    from posenc.evals.report.retrieval import cells, far_near

    out: set[float] = set()
    for task in ("recall", "kv_recall", "offset", "passkey"):
        for row in cells(data["retrieval"], task).values():
            for n in {length for length, _ in row}:
                out |= {x for x in far_near(row, n) if x is not None}
    for hrow in headline(data["records"], data["retrieval"])[2]:  # the headline table: ratios, far accuracy, 95%
        for iv in (hrow.ratio, hrow.far):
            out |= {x for x in (iv.value, iv.lo, iv.hi) if x is not None} if iv is not None else set()
    ppl: dict[tuple[str, str], dict[int, float]] = {}
    for r in data["records"]:
        if r.get("status", "ok") == "ok" and r.get("ppl") is not None:
            ppl.setdefault((r["scheme"], str(r["method"])), {})[int(r["eval_len"])] = float(r["ppl"])
    for rows in ppl.values():
        base = rows[min(rows)]
        out |= {v / base for v in rows.values()}
    return out


def _speed_ratios(data: dict) -> set[float]:
    """A real-model speed run (``bench_real_model*.json``): each method's figure over the untouched model's, in the
    same repeat at the same length (prefill seconds, decode tokens/s, peak memory)."""
    out: set[float] = set()
    for cell in data["lengths"].values():
        for runs in cell.get("runs", {}).values():
            for base, run in zip(cell.get("untouched", []), runs):
                out |= {run[k] / base[k] for k in run if isinstance(run[k], (int, float)) and k in base
                        and isinstance(base[k], (int, float)) and base[k]}
    return out


@cache
def pool(path: str) -> tuple[float, ...]:
    """Every numeric value written in a committed file and, for a bench or speed run, the ratios and means its
    report derives from it (``_bench_aggregates``, ``_speed_ratios``)."""
    text = (ROOT / path).read_text(encoding="utf-8")
    values = {float(x) for x in RAW.findall(text)}
    if path.endswith(".json"):
        data = json.loads(text)
        if isinstance(data, dict) and {"records", "retrieval"} <= set(data):
            values |= _bench_aggregates(data)
        if isinstance(data, dict) and isinstance(data.get("lengths"), dict):
            values |= _speed_ratios(data)
    return tuple(sorted(v for v in values if math.isfinite(v)))


@cache
def percents(path: str) -> tuple[float, ...]:
    """What a number printed with ``%`` may match: the values of ``pool`` x 100 (an accuracy of 0.434 as 43.4%)
    and as they are (a percent the file holds as one, such as a published 96.3)."""
    return tuple(sorted({v * 100 for v in pool(path)} | set(pool(path))))


def _tolerance(printed: str) -> float:
    mantissa, _, exp = printed.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (-decimals) * (10.0 ** int(exp) if exp else 1.0) * (1 + 1e-9)


def found(printed: str, paths: list[str]) -> bool:
    """True when a value of one of ``paths`` rounds to ``printed`` at its printed precision."""
    plain = printed.replace(",", "").removesuffix("%")
    value, tol = float(plain), _tolerance(plain)
    for path in paths:
        values = percents(path) if printed.endswith("%") else pool(path)
        lo = _bisect(values, value - tol)
        if lo < len(values) and values[lo] <= value + tol:
            return True
    return False


def _bisect(values: tuple[float, ...], x: float) -> int:
    import bisect

    return bisect.bisect_left(values, x)


def unsourced(page: Path, text: str | None = None) -> list[str]:
    """The numbers of ``page`` (or of ``text`` as that page) that no source of their block holds."""
    text = page.read_text(encoding="utf-8") if text is None else text
    bad = []
    for paths, block in blocks(text):
        for printed in numbers(block):
            if (page.name, printed) not in ALLOWED and not found(printed, paths):
                bad.append(f"{page.relative_to(ROOT)}: {printed} (sources: {', '.join(paths)})")
    return bad


# ---------------------------------------------------------------- the bench tables, row by row
def _label(cell: str) -> tuple[str, str]:
    """``(scheme, method)`` of a bench table's first cell: ``rope + rerope + logn (w = L/2)`` -> ``("rope",
    "rerope+logn")``, ``learned (+ hierarchical beyond L)`` -> ``("learned", "hierarchical")``, ``irope (every 2)``
    -> ``("irope", "none")``."""
    cell = cell.replace("**", "").replace("(+", "+").replace("beyond L)", "")
    cell = re.sub(r"\([^)]*\)", "", cell).replace("beyond L", "")
    parts = [p.strip() for p in cell.split("+") if p.strip()]
    return parts[0], "+".join(parts[1:]) or "none"


def _row_values(data: dict, scheme: str, method: str) -> tuple[float, ...]:
    """Everything the committed run holds for one table row: its records' perplexity, accuracy and loss, the
    report's means over needle distances and PPL(n)/PPL(L), and the model as trained at L (the row's first
    column for a method that was not evaluated at L itself)."""
    from posenc.evals.report.retrieval import cells, far_near

    def same(s: str) -> bool:
        return s == scheme or s.startswith(scheme + ":")

    from posenc.evals.report.headline import headline

    mine = [r for r in data["records"] if same(r["scheme"]) and str(r["method"]) == method and r.get("ppl")]
    base = [r for r in data["records"] if same(r["scheme"]) and str(r["method"]) == "none" and r.get("ppl")
            and r["eval_len"] == r["train_len"]]
    probed = [r for r in data["retrieval"] if same(r["scheme"]) and str(r["method"]) == method]
    if not mine and not probed:
        return ()
    out = {float(r[k]) for r in mine + base for k in ("ppl", "loss", "accuracy", "train_len")}
    from posenc.evals.report.lab import ppl_bounds
    from posenc.evals.stats.pooling import pool_records

    pooled = pool_records(list({id(r): r for r in mine + base}.values()))  # seeds pooled, each record once
    out |= {x for r in [*mine, *base, *pooled] for x in (*ppl_bounds(r), r["ppl"], r.get("accuracy"))
            if x is not None}
    if mine:
        at_l = min(mine + base, key=lambda r: r["eval_len"])["ppl"]
        out |= {r["ppl"] / at_l for r in mine}
    out |= {float(r[k]) for r in probed for k in ("accuracy", "n", "train_len", "eval_len", "distance")}
    for task in ("recall", "kv_recall", "offset"):
        for (s, m), row in cells(data["retrieval"], task).items():
            if same(s) and m == method:
                out |= {x for n in {length for length, _ in row} for x in far_near(row, n) if x is not None}
    for hrow in headline(data["records"], data["retrieval"])[2]:  # the headline table's row: its intervals
        if same(hrow.scheme) and hrow.method == method:
            for iv in (hrow.ratio, hrow.far):
                out |= {x for x in (iv.value, iv.lo, iv.hi, iv.n) if x is not None} if iv is not None else set()
    return tuple(sorted(out))


def bench_rows(text: str):
    """``(results.json path, first cell, numbers)`` of every row of a table headed ``scheme`` or ``scheme /
    method`` in a block whose source is a bench run's ``results.json``."""
    for paths, block in blocks(text):
        runs = [p for p in paths if p.endswith("/results.json") and "bench-" in p]
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if not (line.startswith("| scheme") and i + 1 < len(lines) and lines[i + 1].startswith("|---")):
                continue
            assert runs, f"a bench table in a block without a bench results.json: {line}"
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                first, rest = row.split("|")[1], "|".join(row.split("|")[2:])
                yield runs[0], first.strip(), numbers(rest)


def row_errors(page: Path, text: str | None = None) -> list[str]:
    """The numbers of the bench tables of ``page`` that their own row of the committed run does not hold."""
    text = page.read_text(encoding="utf-8") if text is None else text
    bad = []
    for path, first, printed_numbers in bench_rows(text):
        data = json.loads((ROOT / path).read_text(encoding="utf-8"))
        values = _row_values(data, *_label(first))
        if not values:
            bad.append(f"{page.name}: row {first!r} is no (scheme, method) of {path}")
            continue
        for printed in printed_numbers:
            plain = printed.replace(",", "").removesuffix("%")
            value, tol = float(plain), _tolerance(plain)
            scaled = [v * 100 for v in values] if printed.endswith("%") else values
            if not any(abs(v - value) <= tol for v in scaled):
                bad.append(f"{page.name}: row {first!r}: {printed} (source: {path})")
    return bad


BENCH_PAGES = [ROOT / "docs" / "results" / f"{name}.md" for name in ("quick", "hybrid", "standard")]


@pytest.mark.parametrize("page", BENCH_PAGES, ids=[p.name for p in BENCH_PAGES])
def test_every_bench_table_cell_is_its_own_rows(page):
    """Stricter than the block check for the bench tables: a cell must match a value of its own row (scheme and
    method) of the run, not any value of the file."""
    assert len(list(bench_rows(page.read_text(encoding="utf-8")))) >= 4
    assert not row_errors(page), "\n".join(row_errors(page))


def test_every_results_page_is_sourced_from_its_first_line():
    for page in PAGES[1:]:
        assert page.read_text(encoding="utf-8").startswith("<!-- source: "), page
    readme = PAGES[0].read_text(encoding="utf-8")
    section = readme[readme.index("## Latest results"):readme.index("## Testing")]
    assert len(blocks(section)) >= 5 and END in section


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_sources_are_committed_results_files(page):
    for paths, _ in blocks(page.read_text(encoding="utf-8")):
        for path in paths:
            assert path.startswith("benchmarks/results/") and (ROOT / path).is_file(), (page.name, path)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_number_is_in_its_source(page):
    assert not unsourced(page), "\n".join(unsourced(page))


def test_the_checker_flags_a_changed_number():
    """Change one number of a page (the untouched SmolLM2's 16k perplexity, 1,154 in its summary) and the checker
    names it; change nothing and it is silent. The numbers it reads include table cells, percents and ratios."""
    page = ROOT / "docs" / "results" / "smollm2.md"
    text = page.read_text(encoding="utf-8")
    assert "goes from 90 at 8k to\n  1,154 at 16k" in text and not unsourced(page, text)
    assert any(": 1,254 " in line for line in unsourced(page, text.replace("1,154 at 16k", "1,254 at 16k")))
    quick = ROOT / "docs" / "results" / "quick.md"
    text = quick.read_text(encoding="utf-8")
    assert "| rope | 6.5 / 45.6% |" in text
    bad = unsourced(quick, text.replace("| rope | 6.5 / 45.6% |", "| rope | 6.5 / 49.1% |"))
    assert any(": 49.1% " in line for line in bad), bad
    assert any("row 'rope': 49.1%" in line for line in row_errors(quick, text.replace(
        "| rope | 6.5 / 45.6% |", "| rope | 6.5 / 49.1% |")))
    assert numbers("x2.7 / 2.61x, 43.4% and 1,154; 8L 16k 135M `0.99` arXiv 2309.17453") == [
        "2.7", "2.61", "43.4%", "1,154"]
    # a sign is read: an interval's negative bound, with either minus sign, not a range's hyphen
    assert numbers("-0.42 [-0.67, \u22120.02] (1-6 of 12), 40-50 s") == ["-0.42", "-0.67", "-0.02", "1", "12", "40"]
    text = page.read_text(encoding="utf-8")
    assert "-0.42 [-0.67, -0.02] (1-6 of 12); against DCA" in text
    bad = unsourced(page, text.replace("-0.42 [-0.67, -0.02] (1-6 of 12); against DCA",
                                       "-0.42 [-0.67, -0.03] (1-6 of 12); against DCA"))
    assert any(": -0.03 " in line for line in bad), bad
