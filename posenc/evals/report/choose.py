"""The "which method for my model" page (``docs/results/which-method.md``), rendered from the committed verdict tables:
the real-model suite (:func:`posenc.evals.report.suite.verdict`, per-method retrieval with 95% Wilson intervals and
n, perplexity with its interval), its paired comparisons (Newcombe intervals of the difference) and the lab's
headline verdicts for models trained from scratch (:func:`posenc.evals.report.headline.headline`).

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


def _real(root: Path) -> tuple[list[str], list[str]]:
    """The real-model section's lines and the methods that extend the model (best first)."""
    from posenc.evals.report.suite import KEEPS_PPL, verdict

    res = _load(root, RUNS["real"])
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

    model = meta["model"].split(":")[0]
    lines = ["## A pretrained RoPE model: extend it without training", "",
             f"Measured on one model, {model} (trained at {_k(train)} tokens; {meta['model'].split(': ', 1)[-1]}), "
             f"read at {', '.join(_k(n) for n in past)} with every training-free method at the parameters its "
             f"record gives for that length (`posenc bench --preset {meta['preset']}`, "
             f"[the full run](smollm2.md#the-full-run-preset-smollm2_full)). The verdict is the suite's rule: "
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
    """The paired comparisons against each reference method, and what they let one say."""
    res = _load(root, RUNS["paired"])
    comps = res["comparisons"]
    versus = list(dict.fromkeys(c["versus"] for c in comps))
    n = comps[0]["n"]
    length = comps[0]["length"]
    lines = [_source(RUNS["paired"]), "",
             f"### Is one of them better? Paired comparisons at {_k(length)}", "",
             f"The table above asks each method few keys, so its intervals overlap. A second run "
             f"([paired comparisons](smollm2.md#paired-comparisons-at-16k-preset-smollm2_paired16k)) asks "
             f"every method the same {n} pass keys at {_k(length)}; each cell is this row's share of keys found minus "
             f"the column's, with its 95% Newcombe interval for paired answers (wins / losses: keys only one of the "
             f"two found).", "",
             "| method | " + " | ".join(f"minus `{v}`" for v in versus) + " |", "|---|" + "---|" * len(versus)]
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
    above = [f"`{m}`" for m in rows if m not in versus and any((by.get((m, v)) or {}).get("lo", 0) > 0
                                                                for v in versus)]
    lines += ["", ("Among the methods that extend the model, no interval above lies wholly above 0 against "
                   + ", ".join(f"`{v}`" for v in versus) + f": with {n} keys none of them is shown better than those "
                   "three." if not above else "Shown better than a reference method (interval above 0): "
                   + ", ".join(separated or above) + "."), ""]
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
        "- **Few keys per cell.** The suite asks each method a few pass keys per length (n in each cell), so most "
        "intervals are wide and overlap; only the paired run separates methods, and it separates few.",
        "- **Parameters.** Each method ran at its record's defaults for the length (`posenc schemes` states them); a "
        "tuned parameter can change a verdict (`posenc tune`).",
        "- **Small trained models.** The trained-in tables come from a small byte-level model trained at L = 64 "
        "tokens; they say which schemes keep finding keys past L at that scale, not at a real model's.",
        "- **Speed and memory** differ as much as quality: [speed on a real model](real-model-speed.md), and the "
        "prefill time and peak memory per method in [the full run](smollm2.md#the-full-run-preset-smollm2_full).",
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
