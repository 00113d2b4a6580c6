"""The matplotlib setup shared by :mod:`posenc.analysis.plots` and :mod:`posenc.evals.report.lab`: figures on the Agg
canvas (``matplotlib.figure.Figure``, no global pyplot state) and PNG saving."""

from __future__ import annotations

from pathlib import Path


def new_figure(width: float, height: float, nrows: int = 1, ncols: int = 1):
    """``(fig, axes)``: a constrained-layout figure of ``width`` x ``height`` inches and its
    ``nrows * ncols`` axes as a flat list (row-major)."""
    from matplotlib.figure import Figure  # Agg canvas, no global pyplot state

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, list(fig.subplots(nrows, ncols, squeeze=False).ravel())


def save_png(fig, path, dpi: int, *, make_dirs: bool = False) -> Path:
    """Write ``fig`` to ``path`` at ``dpi``, atomically (rendered in memory first: a full disk or a kill leaves
    the old PNG or none, never a truncated one); with ``make_dirs`` the missing folders are created."""
    import io

    from posenc.runtime.atomic import atomic_write_bytes

    path = Path(path)
    if not make_dirs and not path.parent.is_dir():
        raise FileNotFoundError(f"could not write {path}: folder {path.parent} does not exist")
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    return atomic_write_bytes(path, buf.getvalue())
