"""All of posenc's GPU checks in one call (at most 8 minutes on an H100/H200), for whichever session is lent a GPU.

    python3 -m benchmarks.gpu.run --out DIR             # on the GPU: DIR/gpu-<card>.json and DIR/log.txt
    python3 -m benchmarks.gpu.run --out DIR --dry-run   # the same script on the CPU at tiny sizes, in seconds

Sections, in order of priority (each item checks the time left and is skipped, and recorded as skipped, when its
share of ``--budget`` is gone; an item that fails is recorded with its traceback and the run goes on; the JSON
is rewritten after every item, so a run cut short keeps what it measured):

1. ``ceilings``: copy bandwidth and bf16 matrix rate of this card, measured here;
2. ``correctness``: every engine path against the float64 reference, cached decode against the full forward
   (:mod:`benchmarks.gpu.correctness`);
3. ``anchors``: RoPE against copy bandwidth, ALiBi against bias-free SDPA, ReRoPE/SelfExtend/DCA/STRING against
   causal flash at 32k, a sliding window at 128k against full causal, a training step against plain SDPA
   (:mod:`benchmarks.gpu.anchors`);
4. ``models``: SmolLM2-135M's and Llama-3.1-8B's shapes through ``posenc.hf.extend``, prefill and decode, every
   main method against the untouched model (:mod:`benchmarks.gpu.models`).

The device's image has its own torch and transformers (nothing can be installed there): posenc is imported
from the working tree; if it cannot be imported the JSON says precisely why and the script stops there. A dry
run (``--dry-run``) takes CUDA's engine routes on the CPU (:func:`posenc.engine.simulate.device_paths`: eager
flex with log-sum-exp, pieces through the device layout), so all of this script but the kernels runs in
``tests/benchmarks/gpu/test_run.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from pathlib import Path

import torch

from benchmarks.gpu.common import Run, card_slug, ceilings


def _args(argv):
    p = argparse.ArgumentParser(prog="benchmarks.gpu.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (created): gpu-<card>.json and log.txt")
    p.add_argument("--dry-run", action="store_true", help="the CPU at tiny sizes (seconds): checks the script")
    p.add_argument("--budget", type=float, default=None, help="seconds for everything (default: 420 on a GPU, "
                   "300 for a dry run); items that do not fit are skipped and listed")
    p.add_argument("--sections", default="ceilings,correctness,anchors,models",
                   help="comma-separated sections to run (default: all)")
    return p.parse_args(argv)


def _import_posenc(run: Run) -> bool:
    try:
        import posenc  # noqa: F401
        import posenc.hf  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        run.data["posenc_import"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc().strip().splitlines()[-12:]}
        run.log(f"posenc does not import here: {type(exc).__name__}: {exc}")
        run.save()
        return False
    run.data["posenc_import"] = {"ok": True}
    return True


SHARES = {"correctness": 0.35, "anchors": 0.3, "models": 0.35}  # of the budget, at most, per section


def _sections(run: Run, names: set[str]) -> None:
    from benchmarks.gpu import anchors, correctness, models

    if "ceilings" in names:
        with run.item("ceilings", "copy and matmul", need=5) as go:
            if go:
                ceilings(run)
    if "correctness" in names:
        with run.share(SHARES["correctness"]):
            correctness.engine_paths(run)
            correctness.cached_decode(run)
    if "anchors" in names:
        with run.share(SHARES["anchors"]):
            anchors.rope_bandwidth(run)
            anchors.remaps(run)
            anchors.alibi(run)
            anchors.sliding_window(run)
            anchors.training_step(run)
    if "models" in names:
        with run.share(1.0):
            models.whole_model(run, "smollm2-135m", (32768, 131072), decode_at=32768)
            models.whole_model(run, "llama-3.1-8b", (32768, 131072), decode_at=32768,
                               methods=("none", "yarn", "selfextend", "rerope", "dca", "string"))
    _compile_stats(run)


def _compile_stats(run: Run) -> None:
    """How many graphs torch.compile built (FlexAttention's), and the cache-size events: what compilation cost."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return
    run.put("compile", "dynamo_stats", {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles")})


def summary(data: dict) -> str:
    """The short table printed last (the device tool returns the end of the output)."""
    lines = [f"card {data['device'].get('name')}  dtype {data['dtype']}  wall {data.get('wall_s')} s  "
             f"errors {len(data['errors'])}  skipped {len(data['skipped'])}"]
    sec = data["sections"]
    if "ceilings" in sec:
        lines.append(f"ceilings: copy {sec['ceilings'].get('copy_GBps')} GB/s, matmul "
                     f"{sec['ceilings'].get('matmul_TFLOPs')} TFLOP/s")
    eng = sec.get("correctness", {}).get("engine", [])
    dec = sec.get("correctness", {}).get("decode", [])
    if eng or dec:
        bad = [f"{r['scheme']}/{r['ran']}/{r['dtype']}/{r['Nq']}x{r['Nk']}: {r['rel_err']:.2e}" for r in eng
               if not r["pass"]]
        bad += [f"decode {r['method']}/{r['dtype']}: {r['rel_err']:.2e} agree {r['greedy_agree']}" for r in dec
                if not r["pass"]]
        lines.append(f"correctness: {sum(r['pass'] for r in eng)}/{len(eng)} engine, "
                     f"{sum(r['pass'] for r in dec)}/{len(dec)} decode; failing: {bad[:8]}")
    anc = sec.get("anchors", {})
    if "rope" in anc:
        lines.append(f"rope: fraction of copy {anc['rope']['fraction_of_copy']}")
    for r in anc.get("remaps", []):
        lines.append(f"{r['method']}: {r['ratio']}x flash ({r['ran']})")
    for key in ("alibi", "sliding_window", "training_step"):
        if key in anc:
            r = anc[key]
            val = r.get("ratio", r.get("speedup", r.get("speed_vs_plain")))
            lines.append(f"{key}: {val} (goal {r['goal']}, ran {r.get('ran', '-')})")
    for r in sec.get("models", {}).get("rows", []):
        lines.append(f"{r['model']} {r['method']} @{r['length']}: prefill {r['prefill_s']} s "
                     f"(x{r.get('prefill_vs_untouched', 1)}), decode {r.get('decode_tok_s', '-')} tok/s "
                     f"(x{r.get('decode_vs_untouched', '-')})")
    for e in data["errors"][:10]:
        lines.append(f"ERROR {e['section']}/{e['item']}: {e['error'][:200]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("benchmarks.gpu.run: no CUDA device here; use --dry-run to check the script on the CPU",
              file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = args.budget if args.budget is not None else (420.0 if cuda else 300.0)
    run = Run(out / f"gpu-{card_slug(device)}.json", out / "log.txt", budget, device, dtype, args.dry_run)
    run.log(f"device {run.data['device']}  versions {run.data['versions']}")
    if not _import_posenc(run):
        print(summary(run.data))
        return 1
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 checks are fp32
    sim = contextlib.nullcontext()
    if args.dry_run:
        from posenc.engine.simulate import device_paths

        sim = device_paths()
    with sim:
        _sections(run, set(args.sections.split(",")))
    run.save()
    print(summary(run.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
