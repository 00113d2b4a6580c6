"""``posenc plot``: draw one analysis picture (:data:`posenc.analysis.plots.PLOTS`)."""

from __future__ import annotations

import argparse

from posenc.cli._common import add_train_len


def add_parser(sub) -> argparse.ArgumentParser:
    from posenc.analysis import plots
    p = sub.add_parser("plot", help="draw an analysis picture (decay, frequencies, rotations)",
                       description=plots.__doc__.splitlines()[0])
    p.add_argument("kind", choices=sorted(plots.PLOTS))
    p.add_argument("--out", required=True, help="output .png file")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--base", type=float, default=10000.0)
    add_train_len(p, 4096)
    p.add_argument("--max-distance", type=int, default=1024, help="decay: largest relative distance")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from posenc._util import check_finite, check_positive_int
    from posenc.analysis.plots import PLOTS, plot_decay

    head_dim = check_positive_int("head-dim", args.head_dim, minimum=2)
    base = check_finite("base", args.base, minimum=1.0, strict_min=True)
    train_len = check_positive_int("train-len", args.train_len)
    if args.kind == "decay":
        path = plot_decay(args.out, head_dim, base, max_distance=args.max_distance)
    else:
        path = PLOTS[args.kind](args.out, head_dim, base, train_len)
    print(path)
    return 0
