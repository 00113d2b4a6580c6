"""The "which method for my model" page (``docs/results/which-method.md``), rendered from the committed verdict tables:
the real-model suite (per-method keys found with 95% Wilson intervals and n, perplexity with its interval, and the
verdict its run was judged by: the interval rule of :mod:`posenc.evals.suite.verdict`, or an earlier run's threshold
rule, :func:`posenc.evals.report.suite.verdict`), its paired comparisons (Newcombe intervals of the difference) and
the lab's headline verdicts for models trained from scratch (:func:`posenc.evals.report.headline.headline`).

Nothing on the page is typed by hand: each number is read from a committed file under ``benchmarks/results/``
(named in the page's ``<!-- source: ... -->`` comments, so ``tests/repo/test_readme_numbers.py`` reads it back too),
and ``tests/evals/report/test_choose.py`` checks that the committed page is what this module renders now.
Regenerate it with ``python -m benchmarks.docs_pages which-method`` (``--check`` compares instead of writing).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PAGE", "RUNS", "page", "stale", "write"]

PAGE = Path("docs/results/which-method.md")  # relative to the repository root
RESULTS = Path("benchmarks/results")
#: the committed runs the page reads: the real model, its paired comparisons, the lab's trained-in schemes
RUNS = {"real": "suite-smollm2-full", "paired": "suite-smollm2-paired16k", "trained": "bench-standard",
        "training_time": "bench-training_time"}
GROUPS = ("extends", "keeps perplexity only", "neither")
#: the interval rule's groups (:mod:`posenc.evals.suite.verdict`), in the page's order
INTERVAL_GROUPS = ("extends", "undecided", "keeps perplexity only", "neither")
#: where each real-model run is discussed (the page's links)
RUN_PAGES = {"suite-smollm2-full": "smollm2.md#the-full-run-preset-smollm2_full",
             "suite-smollm2-paired16k": "smollm2.md#paired-comparisons-at-16k-preset-smollm2_paired16k",
             "suite-smollm2-review": "smollm2.md#the-review-run-preset-smollm2_review",
             "suite-gemma3": "gemma3.md#the-suite-preset-gemma3"}
TITLES = {"extends": "Try first: these extend it (best first: most keys found past the trained length, then the "
                     "lowest perplexity at the longest length)",
          "undecided": "Undecided: an interval spans its threshold at the first length past the trained one (more "
                       "keys or passages would decide)",
          "keeps perplexity only": "These keep its perplexity but lose far keys (fine for text, not for retrieval)",
          "neither": "These do neither"}


def _load(root: Path, run: str) -> dict:
    return json.loads((root / RESULTS / run / "results.json").read_text())


def _source(run: str, report: bool = False) -> str:
    """The source comment of a block read from ``run`` (``report``: its ``report.md`` too, which states the pooled
    trial counts)."""
    files = ["results.json", "report.md"] if report else ["results.json"]
    return "<!-- source: " + " ".join(f"{RESULTS.as_posix()}/{run}/{f}" for f in files) + " -->"


def _up() -> str:
    """From the page's folder up to the repository root (its links to committed figures)."""
    return "../" * len(PAGE.parent.parts)


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _keys(rec: dict | None) -> str:
    iv = (rec or {}).get("retrieval") or {}
    if not iv.get("n"):
        return "-"
    return f"{iv['k']}/{iv['n']} ({iv['value']:.2f} [{iv['lo']:.2f}, {iv['hi']:.2f}])"


def _ppl(rec: dict | None) -> str:
    if not rec or rec.get("ppl") is None:
        return "-"
    def fmt(x: float) -> str:
        return f"{x:.3g}" if x < 1000 else f"{x:.0f}"
    iv = rec.get("ppl_interval") or {}
    return fmt(rec["ppl"]) + (f" [{fmt(iv['lo'])}, {fmt(iv['hi'])}]" if iv.get("lo") is not None else "")


def _group(verdict: str) -> str:
    return next(g for g in GROUPS if verdict.startswith(g) or g == "neither")


def _judged(res: dict) -> bool:
    """Whether the run was judged by the interval rule (its ``reference`` says so), not the earlier threshold."""
    return (res.get("reference") or {}).get("rule") == "interval"


def _link(run: str, text: str) -> str:
    return f"[{text}]({RUN_PAGES.get(run, 'smollm2.md')})"


def _ratio(rec: dict | None) -> str:
    """The paired perplexity ratio to the untouched model at L, with its t interval over passages."""
    r = (rec or {}).get("ppl_ratio")
    if not r or r.get("value") is None:
        return "-"
    return f"{r['value']:.2f}" + (f" [{r['lo']:.2f}, {r['hi']:.2f}]" if r.get("lo") is not None else "")


def _measured_on(meta: dict, past: list[int], link_text: str) -> str:
    """The real-model section's first sentence: the model, its trained length, the lengths read and the run."""
    model, train = meta["model"].split(":")[0], meta["train_len"]
    return (f"Measured on one model, {model} (trained at {_k(train)} tokens; {meta['model'].split(': ', 1)[-1]}), "
            f"read at {', '.join(_k(n) for n in past)} with every training-free method at the parameters its "
            f"record gives for that length (`posenc bench --preset {meta['preset']}`, "
            f"{_link(RUNS['real'], link_text)}).")


def _real_interval(res: dict) -> tuple[list[str], list[str]]:
    """The real-model section of a run judged by the interval rule: each row's stored verdict, its keys with their
    Wilson intervals and its perplexity ratio with its interval at every length past L, grouped by verdict."""
    from posenc.evals.report.suite_answer import verdict_text

    meta, ref = res["meta"], res["reference"]
    train, iv = meta["train_len"], ref["interval"]
    past = sorted({r["eval_len"] for r in res["records"] if r["eval_len"] > train})
    by = {(r["method"], r["eval_len"]): r for r in res["records"]}
    verdicts = res["verdicts"]
    untouched = ref["method"]

    def rank(m: str):
        """Most keys found past the trained length first, then the lowest perplexity ratio at the longest length."""
        found = sum(((by.get((m, n)) or {}).get("retrieval") or {}).get("k") or 0 for n in past)
        ratios = [((by.get((m, n)) or {}).get("ppl_ratio") or {}).get("value") for n in past]
        ran = [r for r in ratios if r is not None]
        return -found, -len(ran), ran[-1] if ran else float("inf")

    def group(m: str) -> str:
        v = verdicts[m]["verdict"]
        return next((g for g in INTERVAL_GROUPS if v.startswith(g)), "neither")

    lines = ["## A pretrained RoPE model: extend it without training", "",
             _measured_on(meta, past, "the run") + " The verdict is the "
             f"suite's interval rule (`posenc.evals.suite.verdict`): at a length a method **extends** when the "
             f"Wilson 95% interval of its keys lies at or above the lower end of the untouched model's at "
             f"{_k(train)} ({iv['k']}/{iv['n']}, [{iv['lo']:.2f}, {iv['hi']:.2f}]) and its perplexity over the "
             f"untouched model's at {_k(train)}, on the same passages, has a 95% interval below "
             f"{ref['ppl_bound']:g}; it is **undecided** when an interval spans its threshold, **keeps perplexity "
             f"only** when the keys are lost, **neither** when the perplexity is; 'extends to N': at every length "
             f"from {_k(train)} to N. RULER (arXiv 2404.06654) instead compares a mean score with a fixed 85.6%. "
             "Keys: labelled keys found / asked, with the Wilson interval; PPL: the geometric mean of the ratio to the "
             f"untouched model at {_k(train)} over the passages, with its t interval.", ""]
    head = ("| method | verdict | " + " | ".join(f"keys at {_k(n)}" for n in past) + " | "
            + " | ".join(f"PPL ratio at {_k(n)}" for n in past) + " |")
    sep = "|---|---|" + "---|" * (2 * len(past))
    methods = [m for m in verdicts if m != untouched]
    extends = []
    for g in INTERVAL_GROUPS:
        rows = sorted((m for m in methods if group(m) == g), key=rank)
        if g == "extends":
            extends = rows
        if not rows and g != "extends":
            continue
        lines += [f"### {TITLES[g]}", "", head, sep]
        for m in [untouched, *rows] if g == "extends" else rows:
            v = verdicts[m]
            shown = "untouched (the reference)" if m == untouched else verdict_text(v) + (
                f" (undecided at {_k(v['undecided_at'])})" if v.get("undecided_at") else "")
            lines.append(f"| `{m}` | {shown} | " + " | ".join(_keys(by.get((m, n))) for n in past)
                         + " | " + " | ".join(_ratio(by.get((m, n))) for n in past) + " |")
        lines.append("")
    lines += [f"![keys found against length, Wilson intervals, one line per method]"
              f"({_up()}{RESULTS.as_posix()}/{RUNS['real']}/accuracy_by_length.png)", ""]
    return lines, extends


def _real(root: Path) -> tuple[list[str], list[str]]:
    """The real-model section's lines and the methods that extend the model (best first)."""
    from posenc.evals.report.suite import KEEPS_PPL, verdict

    res = _load(root, RUNS["real"])
    if _judged(res):
        return _real_interval(res)
    meta, ref = res["meta"], res["reference"]
    train = meta["train_len"]
    lengths = sorted({r["eval_len"] for r in res["records"]})
    past = [n for n in lengths if n > train]
    by = {(r["method"], r["eval_len"]): r for r in res["records"]}
    methods = [m for m in dict.fromkeys(r["method"] for r in res["records"]) if verdict(res, m) != "untouched"]

    def rank(m: str):
        """Most keys found past the trained length first, then the lowest perplexity at the longest length run."""
        found = sum(((by.get((m, n)) or {}).get("retrieval") or {}).get("k") or 0 for n in past)
        ppl = [(by.get((m, n)) or {}).get("ppl") for n in past]
        ran = [p for p in ppl if p is not None]
        return -found, -len(ran), ran[-1] if ran else float("inf")

    lines = ["## A pretrained RoPE model: extend it without training", "",
             _measured_on(meta, past, "the full run") + " The verdict is the suite's rule: "
             f"**extends** when its pass-key retrieval past {_k(train)} reaches {ref['fraction']} x the untouched "
             f"model's {ref['retrieval']:.2f} at {_k(ref['length'])} (threshold "
             f"{ref['threshold']:.4g}: RULER's rule, arXiv 2404.06654, with the model's own reference in place of "
             f"RULER's fixed 85.6%); "
             f"else **keeps perplexity only** when its perplexity past {_k(train)} stays within {KEEPS_PPL:g} x the "
             f"untouched model's at {_k(ref['length'])}; else **neither**. Keys: pass keys found / asked, with the "
             f"95% Wilson interval; perplexity with its 95% interval over the scored blocks.", ""]
    untouched = next(m for m in dict.fromkeys(r["method"] for r in res["records"]) if verdict(res, m) == "untouched")
    head = ("| method | verdict | " + " | ".join(f"keys at {_k(n)}" for n in past) + " | "
            + " | ".join(f"PPL at {_k(n)}" for n in past) + " |")
    sep = "|---|---|" + "---|" * (2 * len(past))
    extends = []
    for g in GROUPS:
        rows = sorted((m for m in methods if _group(verdict(res, m)) == g), key=rank)
        if g == "extends":
            extends = rows
        title = {"extends": "Try first: these extend it (best first: most keys found past the trained length, then "
                            "the lowest perplexity at the longest length)",
                 "keeps perplexity only": "These keep its perplexity but lose far keys (fine for text, not for "
                                          "retrieval)",
                 "neither": "These do neither"}[g]
        lines += [f"### {title}", "", head, sep]
        for m in [untouched, *rows] if g == "extends" else rows:
            shown = "untouched (the reference)" if m == untouched else verdict(res, m)
            lines.append(f"| `{m}` | {shown} | " + " | ".join(_keys(by.get((m, n))) for n in past)
                         + " | " + " | ".join(_ppl(by.get((m, n))) for n in past) + " |")
        lines.append("")
    lines += ["The same run as effective lengths (the stricter rule of RULER's effective length: retrieval must pass "
              "at every length up to it, "
              "so a method that misses at a shorter length is capped there even when it extends past the trained "
              "length):", "",
              f"![effective context length of every method, bars against the trained length]"
              f"({_up()}{RESULTS.as_posix()}/{RUNS['real']}/effective_length.png)", ""]
    return lines, extends


def _paired(root: Path, extends: list[str]) -> list[str]:
    """The paired comparisons against each reference method, and what they let one say: from the real-model run
    itself when it was judged by the interval rule (its keys are the same for every row), else from the paired
    run."""
    real = _load(root, RUNS["real"])
    run = RUNS["real"] if _judged(real) else RUNS["paired"]
    res = real if _judged(real) else _load(root, RUNS["paired"])
    lines = [] if run == RUNS["real"] else [_source(run), ""]
    train = res["meta"]["train_len"]
    comps = [c for c in res["comparisons"] if c["length"] > train]
    for length in sorted({c["length"] for c in comps}):
        at = [c for c in comps if c["length"] == length]
        lines += _paired_table(at, length, extends, run, first=length == min(c["length"] for c in comps))
    return lines


def _paired_table(comps: list[dict], length: int, extends: list[str], run: str, first: bool) -> list[str]:
    """One length's paired differences: each row minus each reference method on the same keys."""
    versus = list(dict.fromkeys(c["versus"] for c in comps))
    n = max(c["n"] for c in comps)
    where = (f"every method is asked the same {n} keys at {_k(length)}" if run == RUNS["real"] else
             f"a second run ({_link(run, 'paired comparisons')}) asks every method the same {n} pass keys at "
             f"{_k(length)}")
    lines = [f"### Is one of them better? Paired comparisons at {_k(length)}", ""]
    if first:
        lines += [f"Each row's own interval overlaps its neighbours', so compare on the same keys: {where}; each cell "
                  "is this row's share of keys found minus the column's, with its 95% Newcombe interval for paired "
                  "answers (wins / losses: keys only one of the two found).", ""]
    else:
        lines += [f"The same at {_k(length)}, where {n} keys were asked.", ""]
    lines += ["| method | " + " | ".join(f"minus `{v}`" for v in versus) + " |", "|---|" + "---|" * len(versus)]
    rows = list(dict.fromkeys(c["method"] for c in comps))
    by = {(c["method"], c["versus"]): c for c in comps}
    separated = []
    for m in rows:
        cells = []
        for v in versus:
            c = by.get((m, v))
            if c is None:
                cells.append("-")
                continue
            cells.append(f"{c['value']:+.2f} [{c['lo']:+.2f}, {c['hi']:+.2f}] ({c['wins']} / {c['losses']})")
            if c["lo"] > 0 and m in extends:
                separated.append(f"`{m}` above `{v}`")
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    refs = [f"`{v}`" for v in versus]
    lines += ["", ("Among the methods that extend the model, no interval lies wholly above 0 against "
                   + ", ".join(refs) + f": with {n} keys none of them is shown better than "
                   + ("those." if len(refs) > 1 else "it.") if not separated else
                   "Shown better than a reference method (interval above 0): " + ", ".join(separated) + "."), ""]
    return lines


def _trained(root: Path) -> list[str]:
    """The lab's trained-in schemes (models trained from scratch) at its headline length."""
    from posenc.evals.report.headline import headline
    from posenc.methods import is_identity

    out = ["## A model you train yourself", "",
           "Measured on a small model only: which position schemes, and which training-time recipes, keep finding keys "
           "past the length they were trained at.", ""]
    for key, what in (("trained", "A position scheme trained in from the start"),
                      ("training_time", "A training-time recipe (PoSE, randomized positions, fine-tunes)")):
        res = _load(root, RUNS[key])
        task, n, rows = headline(res["records"], res["retrieval"])
        rows = [r for r in rows if is_identity(r.method) and r.verdict is not None]
        order = {"extends": 0, "local only": 1, "fails": 2}
        rows.sort(key=lambda r: (order[r.verdict], -(r.far.value if r.far else 0.0)))
        out += [_source(RUNS[key], report=True), "",
                f"### {what} (`posenc bench --preset {res['meta'].get('preset', RUNS[key])}`)", "",
                "A small byte-level model (the lab's recipe, [the results](" +
                ("standard.md" if key == "trained" else "training-time.md") + ")) trained at L (a fine-tune: "
                f"the length it was fine-tuned at) and read at N = {n}: far-needle accuracy is the share of keys "
                "found that sit more than L back, with its 95% Wilson interval over the trials (pooled over seeds); "
                "PPL(N)/PPL(L) the perplexity ratio. Verdicts: **extends** keeps perplexity and finds far keys, "
                "**local only** keeps perplexity and loses them, **fails** loses perplexity; `?` marks an interval "
                "that spans a threshold.", "",
                "| scheme | L | verdict | far-needle accuracy [95%] | trials | seeds | PPL(N)/PPL(L) |",
                "|---|---:|---|---|---:|---:|---|"]
        for r in rows:
            far = "-" if r.far is None else f"{r.far.value:.2f} [{r.far.lo:.2f}, {r.far.hi:.2f}]"
            ratio = "-" if r.ratio is None else (f"{r.ratio.value:.2f}" + (f" [{r.ratio.lo:.2f}, {r.ratio.hi:.2f}]"
                                                                          if r.ratio.known else ""))
            out.append(f"| `{r.scheme}` | {r.train_len} | {r.verdict}{'?' if r.doubts else ''} | {far} | "
                       f"{r.far.n if r.far else '-'} | {r.seeds} | {ratio} |")
        out.append("")
    return out


def page(root=".") -> str:
    """The page's Markdown, from the committed results under ``root`` (the repository)."""
    root = Path(root)
    real, extends = _real(root)
    paired = _paired(root, extends)
    res = _load(root, RUNS["real"])
    top = ", ".join(f"`{m}`" for m in extends[:3])
    if _judged(res):
        n = res["reference"]["interval"]["n"]
        few = (f"- **Keys per cell.** The suite asks each method {n} labelled keys per length (fewer where a row "
               "says so), so a row's interval is still wide: rows a few keys apart are not told apart by their own "
               "intervals, and the paired tables separate few of them.")
    else:
        few = ("- **Few keys per cell.** The suite asks each method a few pass keys per length (n in each cell), so "
               "most intervals are wide and overlap; only the paired run separates methods, and it separates few.")
    intro = [
        _source(RUNS["real"]),
        "<!-- generated by `python -m benchmarks.docs_pages which-method` from the committed results it names; do not "
        "edit by hand -->",
        "# Which method for my model?",
        "",
        "**A pretrained RoPE model you want to read past its context, without training**: start with the methods that "
        "extend the real model below (best first by keys found, then perplexity: " + top + "), and check them "
        "on your own model and task with `posenc eval` or `posenc bench` before relying on one: `posenc extend MODEL "
        f"--method {extends[0] if extends else 'yarn'} --out DIR` writes the extended model (`posenc schemes "
        f"{extends[0] if extends else 'yarn'}` states its parameters), `posenc tune MODEL` searches the methods on "
        "your model. **A model you train yourself**: the trained-in "
        "schemes at the end, measured on a small model only.",
        "",
        "Read the caveats at the end before drawing a conclusion: one small model, few keys per cell.",
        "",
    ]
    caveats = [
        "## Caveats", "",
        f"- **One model.** Every real-model number is {res['meta']['model'].split(':')[0]}'s; a larger model, another "
        "base frequency or another trained length can order the methods differently. The verdicts are what this "
        "model did, not a property of the method.",
        few,
        "- **Parameters.** Each method ran at its record's defaults for the length (`posenc schemes` states them); a "
        "tuned parameter can change a verdict (`posenc tune`).",
        "- **Small trained models.** The trained-in tables come from a small byte-level model trained at L = 64 "
        "tokens; they say which schemes keep finding keys past L at that scale, not at a real model's.",
        "- **Speed and memory** differ as much as quality: [speed on a real model](real-model-speed.md), and the "
        f"prefill time and peak memory per method in {_link(RUNS['real'], 'the run')}.",
        "- What each method does to positions, drawn: [the method atlas](../atlas.md).",
        "",
    ]
    return "\n".join(intro + real + paired + _trained(root) + ["<!-- end source -->", ""] + caveats)


def stale(root) -> list[str]:
    """The page's path when the committed page differs from what the committed results render now, else []."""
    root = Path(root)
    current = (root / PAGE).read_text() if (root / PAGE).is_file() else None
    return [] if current == page(root) else [str(PAGE)]


def write(root) -> Path:
    """Write the page under the repository ``root``; the command line is ``python -m benchmarks.docs_pages
    which-method``."""
    from posenc.runtime.atomic import atomic_write_text

    atomic_write_text(Path(root) / PAGE, page(root))
    return Path(root) / PAGE
