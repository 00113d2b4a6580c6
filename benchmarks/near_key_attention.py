"""Where the answer looks when a key close to the question is lost: the near-key diagnostic.

    .venv/bin/python -m benchmarks.near_key_attention [--rows none@8192,rerope@16384,...] [--distances 512,1024,...]
                                                       [--seeds 100-101] [--model smollm2]

The suite's SmolLM2 runs saw remaps (ReRoPE, Leaky ReRoPE, DCA, InfLLM-style retrieval, LM-Infinite) at 16k lose a
pass key ~700 tokens back, inside every window and every remap's exact range, that the untouched model finds at 8k.
This measures it on held-out contexts (seeds the suite never uses: ``--seeds``, default 100-101) with one pass key
placed ``--distances`` tokens before the question in the noise haystack, for each row ``method@length``, and for
every question records where the answer's first token looks (:func:`posenc.evals.attention.answer_attention`):
the attention mass of the question's last token per layer and head on the needle, the other tokens by region, the
keys the method reads at a remapped position, the keys past the trained length. Every row runs on posenc's engine
(the untouched model on its identity path) so that every layer's weights are seen; the parameters are the suite's
per-length defaults (:func:`posenc.evals.suite.spec.method_params`).

Written after every context to ``benchmarks/results/near_key_attention.json`` (atomically) and resumed from it. A
correctness run, not a timing: each context records the 1-minute load before and after it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks.common import RESULTS, machine_info, seed_range

NAME = "near_key_attention"
DEFAULT_ROWS = "none@4096,none@8192,rerope@16384,dca@16384,selfextend@16384,yarn@16384"
BINS = ((256, 768), (768, 1536), (1536, 3072), (3072, 6144))  # around the default distances 512, 1k, 2k, 4k
HEADS = 4  # retrieval heads summarised
REGIONS_KEPT = ("answer", "needle", "other_needles", "start", "question", "haystack", "remapped", "beyond")


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise SystemExit(f"{flag} takes comma-separated integers, got {text!r}") from None


def _rows(text: str) -> list[tuple[str, str, int]]:
    """``(label, method, length)`` per ``[label=]method@length`` item (the label defaults to ``method@length``)."""
    out = []
    for item in text.split(","):
        label, _, spec = item.rpartition("=")
        method, _, length = spec.partition("@")
        if not method or not length.isdigit():
            raise SystemExit(f"--rows takes [label=]method@length items such as rerope@16384, got {item!r}")
        out.append((label or spec, method, int(length)))
    return out


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def retrieval_heads(questions: list[dict], k: int = HEADS) -> list[tuple[int, int]]:
    """The ``k`` (layer, head) pairs that put the most weight on the answer's tokens, averaged over the questions
    answered right (every row): the heads that read the key out when the model finds it."""
    import torch

    right = [torch.tensor(q["mass"]["answer"]) for q in questions if q["correct"]]
    if not right:
        return []
    mean = torch.stack(right).mean(0)  # [layers, heads]
    top = mean.flatten().topk(min(k, mean.numel())).indices.tolist()
    return [(i // mean.shape[1], i % mean.shape[1]) for i in top]


def question_summary(q: dict, heads: list[tuple[int, int]] = ()) -> dict:
    """One question's masses reduced: per region the mean over layers and heads, the answer's and the needle's
    largest (layer, head) mass, and per region the mean over the retrieval ``heads``."""
    import torch

    m = {k: torch.tensor(v) for k, v in q["mass"].items()}
    out = {f"{k}_mean": float(v.mean()) for k, v in m.items()}
    out["needle_peak"] = float(m["needle"].max())
    out["answer_peak"] = float(m["answer"].max())
    for k, v in m.items():
        if heads:
            out[f"{k}_heads"] = float(sum(v[layer, h] for layer, h in heads) / len(heads))
    return out


def summary(questions: list[dict]) -> dict:
    """Per row: keys found per distance bin (Wilson 95%), and the mean of each question's reduced masses over the
    questions answered right and over those answered wrong; the retrieval heads (:func:`retrieval_heads`)."""
    from posenc.evals.stats.intervals import wilson

    heads = retrieval_heads(questions)
    out = {"retrieval_heads": [list(h) for h in heads], "rows": {}}
    for row in dict.fromkeys(q["row"] for q in questions):
        sel = [q for q in questions if q["row"] == row]
        bins = []
        for lo, hi in BINS:
            b = [q for q in sel if lo <= q["distance"] < hi]
            if b:
                k = sum(q["correct"] for q in b)
                iv = wilson(k, len(b))
                bins.append({"lo": lo, "hi": hi, "k": k, "n": len(b), "value": iv.value, "lo95": iv.lo,
                             "hi95": iv.hi})
        k = sum(q["correct"] for q in sel)
        iv = wilson(k, len(sel))
        reduced = [question_summary(q, heads) | {"correct": q["correct"]} for q in sel]
        fields = [f for f in reduced[0] if f != "correct"]
        by = {}
        for label, want in (("right", True), ("wrong", False)):
            rs = [r for r in reduced if r["correct"] == want]
            by[label] = {"n": len(rs), **{f: _mean([r[f] for r in rs]) for f in fields}}
        per_head = {}
        for layer, h in heads:
            per_head[f"L{layer}H{h}"] = {
                label: {region: _mean([q["mass"][region][layer][h] for q in sel if q["correct"] == want])
                        for region in ("answer", "needle", "start", "haystack")}
                for label, want in (("right", True), ("wrong", False))}
        out["rows"][row] = {"k": k, "n": len(sel), "value": iv.value, "lo": iv.lo, "hi": iv.hi, "bins": bins,
                            "mass": {"all": {f: _mean([r[f] for r in reduced]) for f in fields}, **by},
                            "heads": per_head}
    return out


def _write(name: str, model: str, m, questions: list[dict]) -> None:
    """The results, compact (a question's masses are ``[layers][heads]`` per region: one line each would make
    megabytes), masses to 4 decimals."""
    from posenc.runtime.atomic import atomic_write_text

    for q in questions:
        q["mass"] = {k: [[round(x, 4) for x in layer] for layer in v] for k, v in q["mass"].items()}
    payload = {"benchmark": NAME, "machine": machine_info(), "model": model, "model_id": m.model_id,
               "train_len": m.train_len, "bins": BINS, "summary": summary(questions), "questions": questions}
    path = RESULTS / f"{name}.json"
    atomic_write_text(path, json.dumps(payload, separators=(",", ":"), default=str) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=DEFAULT_ROWS,
                   help="[label=]method@length items; a label's parameters can be set with --params")
    p.add_argument("--params", default="{}", metavar="JSON",
                   help="parameters per row label over the suite's per-length defaults, e.g. "
                        "'{\"sharp=yarn@8192\": {\"factor\": 1, \"attention_factor\": 1.1}}' keyed by the label")
    p.add_argument("--distances", default="512,1024,2048,4096")
    p.add_argument("--seeds", default="100-101")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--name", default=NAME, help="the results file's name under benchmarks/results (a trial: another)")
    args = p.parse_args(argv)
    rows, distances, seeds = _rows(args.rows), _ints(args.distances, "--distances"), seed_range(args.seeds, "100-101")
    try:
        fixed = json.loads(args.params)
    except ValueError:
        raise SystemExit(f"--params takes a JSON object of parameters per row label, got {args.params!r}") from None

    from posenc.evals.attention import answer_attention
    from posenc.evals.suite.spec import load_facts, method_params
    from posenc.tasks.context import build_context
    from posenc.tasks.haystack import make_haystack

    path = RESULTS / f"{args.name}.json"
    questions = json.loads(path.read_text())["questions"] if path.exists() else []
    m = load_facts(args.model)
    hay = make_haystack("noise", m.tokenizer)
    t_all = time.perf_counter()
    for row, method, length in rows:
        todo = [(d, s) for d in distances for s in seeds
                if not any(q["row"] == row and q["target_distance"] == d and q["seed"] == s for q in questions)]
        if not todo:
            continue
        params = {**method_params(method, m.train_len, length, m.head_dim, m.base, {}), **fixed.get(row, {})}
        model = m.fresh(method, {"native": False, **params})
        for d, seed in todo:
            depth = max(0.0, min(1.0, 1.0 - d / length))
            ctx = build_context(m.tokenizer, hay, length, ("passkey",), seed, options={"passkey": {"depth": depth}})
            load = os.getloadavg()[0]
            t = time.perf_counter()
            (a,) = answer_attention(model, m.tokenizer, ctx, train_len=m.train_len)
            q = {"row": row, "method": method, "params": params, "length": length, "seed": seed,
                 "target_distance": d, **a.to_dict(), "seconds": round(time.perf_counter() - t, 1),
                 "loadavg": [round(load, 2), round(os.getloadavg()[0], 2)]}
            q["mass"] = {k: v for k, v in q["mass"].items() if k in REGIONS_KEPT}
            questions.append(q)
            r = question_summary(q)
            print(f"{row} seed {seed}: {'right' if a.correct else 'wrong'} ({a.distance} back) {a.answer!r}; "
                  f"answer mean {r['answer_mean']:.4f} peak {r['answer_peak']:.3f}, needle {r['needle_mean']:.4f}, "
                  f"start {r['start_mean']:.3f}, remapped {r['remapped_mean']:.3f}", flush=True)
            _write(args.name, args.model, m, questions)
        del model
    _write(args.name, args.model, m, questions)  # the summary of every question, whatever ran this time
    print(f"done in {time.perf_counter() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
