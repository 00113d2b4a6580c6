"""The matplotlib setup shared by :mod:`posenc.analysis.plots` and :mod:`posenc.lab.report`: figures on the Agg canvas
(``matplotlib.figure.Figure``, no global pyplot state) and PNG saving."""

from __future__ import annotations

from pathlib import Path


def new_figure(width: float, height: float, nrows: int = 1, ncols: int = 1):
    """``(fig, axes)``: a constrained-layout figure of ``width`` x ``height`` inches and its
    ``nrows * ncols`` axes as a flat list (row-major)."""
    from matplotlib.figure import Figure  # Agg canvas, no global pyplot state

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, list(fig.subplots(nrows, ncols, squeeze=False).ravel())


def save_png(fig, path, dpi: int, *, make_dirs: bool = False) -> Path:
    """Write ``fig`` to ``path`` at ``dpi``; with ``make_dirs`` the missing folders are created."""
    path = Path(path)
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
