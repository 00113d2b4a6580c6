"""The ``retrieval`` preset cut to one seed of RoPE (with its training-free methods) and NoPE, 64 windows per
perplexity cell: a first measurement of the kv probes through ``posenc bench`` before the full preset runs.

``python -m benchmarks.retrieval_one_seed OUT_DIR [RUNS_DIR]`` (about 20 minutes on 2 CPU cores); the committed
run is ``benchmarks/results/ablation/retrieval-one-seed/``. One seed and 32 probe sequences per cell: every
accuracy carries its Wilson interval, and nothing here is a claim across seeds.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from posenc.lab.bench import PRESETS, run_bench


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) not in (1, 2):
        print("usage: python -m benchmarks.retrieval_one_seed OUT_DIR [RUNS_DIR]", file=sys.stderr)
        return 2
    preset = replace(PRESETS["retrieval"], name="retrieval-one-seed",
                     description="the retrieval preset at one seed, RoPE (+ 9 methods) and NoPE, 64 windows per cell",
                     schemes=("rope", "nope"), seeds=1, max_windows=64)
    run_bench(preset, argv[0], progress=True, runs_dir=argv[1] if len(argv) == 2 else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
