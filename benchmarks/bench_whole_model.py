"""The whole model against one layer, in one run: is SmolLM2's 16k prefill through all thirty layers further from the
fp32 matmul peak than one layer is, and where does its time go?

    .venv/bin/python -m benchmarks.bench_whole_model [--length 16384] [--repeats 2] [--out DIR]

In one process, on the untouched model (transformers' own SDPA path, float32, ``logits_to_keep=1``): the fp32 matmul
peak (:func:`benchmarks.bench_real_model.matmul_peak`) before and after, and, interleaved per repeat, a prefill of
``--length`` random tokens through the whole model and through its first layer alone (a second model object cut to
one layer). Each prefill's achieved GFLOP/s (:func:`benchmarks.bench_real_model.forward_flops`) is divided by the
mean of the two peaks. Then one more whole-model prefill under ``torch.profiler``: the time per operator group
(matrix products of the projections and MLP, attention, the rest), so a gap has a named place.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.bench_real_model import forward_flops, load_model, matmul_peak
from benchmarks.common import RESULTS, write_json

GROUPS = {"matmul (projections, MLP, lm_head)": ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul"),
          "attention (SDPA)": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                               "aten::scaled_dot_product_attention")}


def prefill(model, ids) -> float:
    with torch.no_grad():
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        return time.perf_counter() - t0


def profile_groups(model, ids) -> dict:
    """Self CPU seconds of one prefill per operator group (:data:`GROUPS`, the rest as "other")."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
    out = {g: 0.0 for g in GROUPS} | {"other": 0.0}
    for e in prof.key_averages():
        group = next((g for g, names in GROUPS.items() if e.key in names), "other")
        out[group] += e.self_cpu_time_total / 1e6
    top = sorted(((e.self_cpu_time_total / 1e6, e.key) for e in prof.key_averages()), reverse=True)[:8]
    return {"self_cpu_s": out, "top_ops": [{"op": k, "self_cpu_s": s} for s, k in top]}


def run(length: int = 16384, repeats: int = 2, log=print) -> dict:
    peak0 = matmul_peak()
    whole, one = load_model(None), load_model(1)
    cfg = whole.config
    ids = torch.randint(0, cfg.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    prefill(one, ids[:, :512])  # warm both paths (one-time allocations) unrecorded
    prefill(whole, ids[:, :512])
    times = {"whole": [], "one_layer": []}
    loads = []
    for rep in range(repeats):
        for name in (("whole", "one_layer") if rep % 2 == 0 else ("one_layer", "whole")):
            model = whole if name == "whole" else one
            times[name].append(prefill(model, ids))
            loads.append(os.getloadavg()[0])
            log(f"  rep {rep} {name}: {times[name][-1]:.2f} s (load {loads[-1]:.2f})")
    peak1 = matmul_peak()
    peak = (peak0 + peak1) / 2
    n_layers = len(whole.model.layers)
    res = {"model": "SmolLM2-135M-Instruct (float32, CPU), untouched, transformers SDPA", "length": length,
           "repeats": repeats, "torch_threads": torch.get_num_threads(), "matmul_peak_gflops": [peak0, peak1],
           "loadavg_during": loads}
    for name, layers in (("whole", n_layers), ("one_layer", 1)):
        best = min(times[name])
        gflops = forward_flops(cfg, length, layers) / best / 1e9
        res[name] = {"layers": layers, "prefill_s": times[name], "best_s": best, "per_layer_s": best / layers,
                     "gflops": gflops, "fraction_of_peak": gflops / peak}
    res["whole_per_layer_over_one_layer"] = res["whole"]["per_layer_s"] / res["one_layer"]["per_layer_s"]
    log("  profiling one whole-model prefill")
    res["profile_whole"] = profile_groups(whole, ids)
    res["median_load"] = statistics.median(loads)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.bench_whole_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args(argv)
    res = run(a.length, a.repeats)
    print(f"wrote {write_json('bench_whole_model', res, a.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
