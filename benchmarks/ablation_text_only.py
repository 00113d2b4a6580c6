"""The quick preset's RoPE model trained on text only (no recall rows): what the recall rows cost the text metrics.

``python -m benchmarks.ablation_text_only OUT_DIR`` (about 3 minutes on 2 CPU cores); the committed run is
``benchmarks/results/ablation/quick-text-only/`` and ``docs/results/quick.md`` compares it with ``bench-quick``'s
RoPE row.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from posenc.evals.lab.bench import PRESETS, run_bench


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m benchmarks.ablation_text_only OUT_DIR", file=sys.stderr)
        return 2
    preset = replace(PRESETS["quick"], name="quick-text-only", description="quick's RoPE model without the recall rows",
                     schemes=("rope",), rope_methods=(), learned_methods=(), recall_batch=0)
    run_bench(preset, argv[0], progress=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
