"""``posenc plot KIND``: draw one analysis picture (:data:`posenc.analysis.plots.PLOTS`) as ``OUT/KIND.png``."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.cli._common import add_out, add_train_len, subparser, warn

KINDS = {"decay": "RoPE long-range decay (RoFormer bound) next to the sinusoidal inner product",
         "frequencies": "inv_freq per dimension under default, PI, NTK and YaRN schedules",
         "rotations": "YaRN rotations per dimension with its thresholds and the critical dimension"}


def add_parser(sub) -> argparse.ArgumentParser:
    p = subparser(sub, "plot", "draw an analysis picture (decay, frequencies, rotations)",
                  "Draw one analysis picture as OUT/KIND.png: " + "; ".join(f"{k}: {v}" for k, v in KINDS.items()))
    p.add_argument("kind", choices=sorted(KINDS), metavar="KIND", help="decay, frequencies or rotations")
    add_out(p, "folder for KIND.png (created when its parent exists)", default=".")
    p.add_argument("--head-dim", type=int, default=128, metavar="N", help="attention head dimension")
    p.add_argument("--base", type=float, default=10000.0, metavar="X", help="RoPE base")
    add_train_len(p, 4096, help="trained context length L (frequencies, rotations)")
    p.add_argument("--max-distance", type=int, default=1024, metavar="N", help="decay: largest relative distance")
    p.set_defaults(func=run)
    return p


def _target(out: str, kind: str) -> Path:
    path = Path(out)
    if path.suffix.lower() == ".png":  # the old spelling: --out FILE.png
        warn(f"--out {out}: --out is a folder now; a .png file is deprecated and will be removed in the next release "
             f"(--out DIR writes DIR/{kind}.png)")
        return path
    if not path.is_dir():
        if not path.parent.is_dir():  # never create a chain of folders (a typo would make them from the root)
            raise ValueError(f"--out folder {str(path)!r} cannot be created: {str(path.parent)!r} does not exist")
        path.mkdir()
    return path / f"{kind}.png"


def run(args: argparse.Namespace) -> int:
    from posenc._util import check_finite, check_positive_int
    from posenc.analysis.plots import PLOTS, plot_decay

    head_dim = check_positive_int("--head-dim", args.head_dim, minimum=2)
    base = check_finite("--base", args.base, minimum=1.0, strict_min=True)
    train_len = check_positive_int("--train-len", args.train_len)
    check_positive_int("--max-distance", args.max_distance)
    target = _target(args.out, args.kind)
    if args.kind == "decay":
        path = plot_decay(target, head_dim, base, max_distance=args.max_distance)
    else:
        path = PLOTS[args.kind](target, head_dim, base, train_len)
    print(path)
    return 0
