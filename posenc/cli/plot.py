"""``posenc plot KIND``: draw one analysis picture (:data:`posenc.analysis.plots.PLOTS`) as ``OUT/KIND.png``, or a
method's position map (``posenc plot map --method NAME --length N``, :func:`posenc.analysis.plots.plot_map`) as
``OUT/map-NAME.png``."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.cli._common import UsageError, add_method, add_out, add_train_len, params_from_args, subparser, warn

KINDS = {"decay": "RoPE long-range decay (RoFormer bound) next to the sinusoidal inner product",
         "frequencies": "inv_freq per dimension under default, PI, NTK and YaRN schedules",
         "rotations": "YaRN rotations per dimension with its thresholds and the critical dimension",
         "map": "a method's position map: the relative position each (query, key) pair is read at, its mask, and its "
                "frequency schedule against the trained range"}
MAP_MAX_LENGTH = 2048  # the map draws LENGTH x LENGTH pairs


def add_parser(sub) -> argparse.ArgumentParser:
    p = subparser(sub, "plot", "draw an analysis picture (decay, frequencies, rotations, map)",
                  "Draw one analysis picture as OUT/KIND.png (map: OUT/map-METHOD.png): "
                  + "; ".join(f"{k}: {v}" for k, v in KINDS.items()))
    p.add_argument("kind", choices=sorted(KINDS), metavar="KIND", help="decay, frequencies, rotations or map")
    add_out(p, "folder for KIND.png (created with its parents when missing)", default=".")
    p.add_argument("--head-dim", type=int, default=None, metavar="N",
                   help="attention head dimension (default: 128; map: 64)")
    p.add_argument("--base", type=float, default=10000.0, metavar="X", help="RoPE base")
    add_train_len(p, None, help="trained context length L (frequencies, rotations, map) (default: 4096; map: "
                                "LENGTH / 4)")
    p.add_argument("--max-distance", type=int, default=1024, metavar="N", help="decay: largest relative distance")
    add_method(p, "map: the method to draw (a+b composes; a trained-in scheme name too)",
               param_help="map: a method parameter, repeatable (default: the method's own at LENGTH)")
    p.add_argument("--length", type=int, default=None, metavar="N",
                   help=f"map: the sequence length to read (at most {MAP_MAX_LENGTH})")
    p.set_defaults(func=run)
    return p


def _target(out: str, kind: str) -> Path:
    path = Path(out)
    if path.suffix.lower() == ".png":  # the old spelling: --out FILE.png
        warn(f"--out {out}: --out is a folder now; a .png file is deprecated and will be removed in the next release "
             f"(--out DIR writes DIR/{kind}.png)")
        path.parent.mkdir(parents=True, exist_ok=True)  # missing folders created, as every command's --out
        return path
    from posenc.runtime.folders import check_target

    check_target(path, what="--out", replace=True)  # a file: one line naming --out, not [Errno 17]
    path.mkdir(parents=True, exist_ok=True)  # with its missing parents, as every command's --out (extend, eval, ...)
    return path / f"{kind}.png"


def _map(args: argparse.Namespace, head_dim: int, base: float) -> Path:
    """``posenc plot map``: the method's position map at ``--length`` (:func:`posenc.analysis.plots.plot_map`)."""
    from posenc._util import check_positive_int
    from posenc.analysis.maps import method_scheme
    from posenc.analysis.plots import plot_map
    from posenc.methods import TRAINED_METHODS, parse_methods
    from posenc.scheme.core import TRAINED

    if args.method is None or args.length is None:
        raise UsageError("plot map needs --method NAME and --length N (see posenc plot --help)")
    length = check_positive_int("--length", args.length, minimum=2)
    if length > MAP_MAX_LENGTH:
        raise ValueError(f"--length must be at most {MAP_MAX_LENGTH} (the map draws LENGTH x LENGTH pairs), "
                         f"got {length}")
    train_len = check_positive_int("--train-len", args.train_len if args.train_len is not None
                                   else max(length // 4, 1))
    if args.method not in TRAINED and args.method not in TRAINED_METHODS:
        parse_methods(args.method)  # an unknown name: one line with "did you mean" (posenc.cli.main)
    params = params_from_args(args)
    method_scheme(args.method, train_len, length, params, head_dim=head_dim, base=base)  # bad parameters: before --out
    target = _target(args.out, "map-" + args.method.replace("/", "_"))
    return plot_map(target, args.method, train_len, length, params, head_dim=head_dim, base=base)


def run(args: argparse.Namespace) -> int:
    from posenc._util import check_finite, check_positive_int
    from posenc.analysis.plots import PLOTS, plot_decay

    head_dim = check_positive_int("--head-dim", args.head_dim if args.head_dim is not None
                                  else 64 if args.kind == "map" else 128, minimum=2)
    base = check_finite("--base", args.base, minimum=1.0, strict_min=True)
    check_positive_int("--max-distance", args.max_distance)
    if args.kind == "map":
        print(_map(args, head_dim, base))
        return 0
    given = [f for f, v in (("--method", args.method), ("--length", args.length), ("--param", args.param),
                            ("--factor", args.factor), ("--window", args.window)) if v not in (None, [])]
    if given:
        raise UsageError(f"{given[0]} is a flag of plot map only, not of plot {args.kind}")
    train_len = check_positive_int("--train-len", args.train_len if args.train_len is not None else 4096)
    target = _target(args.out, args.kind)
    if args.kind == "decay":
        path = plot_decay(target, head_dim, base, max_distance=args.max_distance)
    else:
        path = PLOTS[args.kind](target, head_dim, base, train_len)
    print(path)
    return 0
