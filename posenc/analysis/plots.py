"""Pictures of RoPE's closed-form curves, drawn from :mod:`posenc.analysis` (matplotlib, Agg, no pyplot state).

- :func:`plot_decay`: RoPE long-range decay (RoFormer bound + all-ones inner product) and the
  sinusoidal ``p_0 . p_r``.
- :func:`plot_frequencies`: ``inv_freq`` per dimension for default / linear (PI) / NTK / YaRN schedules
  (from ``posenc.parts.frequencies.rope_frequencies``) and their ratio to the default.
- :func:`plot_rotations`: YaRN rotations ``r_i`` with the ``beta_fast``/``beta_slow`` thresholds, the
  ramp, and the critical dimension of arXiv 2310.05209.
- :func:`plot_map`: a method's position map (:mod:`posenc.analysis.maps`): the relative position each (query, key)
  pair is read at, the mask, and the turns each dimension makes over the positions read next to the trained range.

Command line (:mod:`posenc.cli.plot`):
``posenc plot {decay,frequencies,rotations} --out DIR [--head-dim --base --train-len]`` and
``posenc plot map --method NAME [--param K=V] --length N --out DIR``.
"""

from __future__ import annotations

from pathlib import Path

from posenc._figures import new_figure, save_png
from posenc._util import check_finite
from posenc.analysis import rope as analysis

__all__ = ["PLOTS", "map_title", "plot_decay", "plot_frequencies", "plot_map", "plot_rotations"]


def _figure(ncols: int = 1, width: float = 6.4):
    return new_figure(width * ncols, 4.4, 1, ncols)


def _save(fig, path, dpi: int = 110) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"out must be a .png file, got {str(path)!r}")
    if not path.parent.is_dir():  # never create folders (a typo would make them from the root)
        raise ValueError(f"out folder {str(path.parent)!r} does not exist; create it first")
    return save_png(fig, path, dpi=dpi)


def plot_decay(path, head_dim: int = 128, base: float = 10000.0, max_distance: int = 1024) -> Path:
    """RoPE decay (RoFormer fig. 2, arXiv 2104.09864) next to the sinusoidal inner product."""
    curve = analysis.rope_decay_curve(head_dim, max_distance, base)
    sinus = analysis.sinusoidal_inner_product(head_dim, max_distance, base)
    fig, (left, right) = _figure(2)
    r = curve.distance.numpy()
    left.plot(r, curve.upper_bound.numpy(), label=r"bound $\frac{1}{d/2}\sum_j |S_j|$")
    left.plot(r, curve.inner_product.numpy() * curve.upper_bound[0].item(), alpha=0.7,
              label=r"all-ones $q\cdot R_r k$ (scaled to bound at 0)")
    left.set_title(f"RoPE long-range decay (d={head_dim}, base={base:g})")
    left.set_xlabel("relative distance r")
    left.set_ylabel("relative upper bound")
    left.grid(alpha=0.3)
    left.legend()
    right.plot(r, sinus.numpy(), color="tab:green", label=r"$p_0 \cdot p_r$")
    right.set_title(f"Sinusoidal inner product (d={head_dim}, base={base:g})")
    right.set_xlabel("relative distance r")
    right.set_ylabel(r"$p_0 \cdot p_r$")
    right.grid(alpha=0.3)
    right.legend()
    return _save(fig, path)


def _schedules(head_dim: int, base: float, train_len: int, factor: float):
    """(label, RopeFrequencies) for default, linear/PI, NTK-aware and YaRN at ``L_test = factor * L``."""
    from posenc.methods import METHODS
    from posenc.parts.frequencies import rope_frequencies  # lazy: owned by another module

    def scaled(method: str, **extra) -> dict:
        return {"rope_type": METHODS[method].scaling_type, "factor": factor, **extra}

    return [("default", rope_frequencies(head_dim, base)),
            (f"linear / PI (s={factor:g})", rope_frequencies(head_dim, base, scaled("pi"))),
            (f"NTK-aware (s={factor:g})", rope_frequencies(head_dim, base, scaled("ntk"))),
            (f"YaRN (s={factor:g})",
             rope_frequencies(head_dim, base, scaled("yarn", original_max_position_embeddings=train_len)))]


def plot_frequencies(path, head_dim: int = 128, base: float = 10000.0, train_len: int = 4096,
                     factor: float = 4.0) -> Path:
    """``inv_freq`` per dimension pair for several schedules (log y), and each divided by the default."""
    factor = check_finite("factor", factor, minimum=1.0)
    schedules = _schedules(head_dim, base, train_len, factor)
    default = schedules[0][1].inv_freq.double()
    fig, (left, right) = _figure(2)
    for (label, freqs), style in zip(schedules, ["-", "--", "-.", ":"]):
        inv = freqs.inv_freq.double()
        idx = range(inv.numel())
        left.plot(idx, inv.numpy(), style, label=label)
        right.plot(idx, (inv / default).numpy(), style, label=label)
    left.set_yscale("log")
    left.set_title(f"RoPE frequencies (d={head_dim}, base={base:g}, L_train={train_len})")
    left.set_xlabel("dimension pair i")
    left.set_ylabel(r"$\theta_i$ (rad / token)")
    right.set_yscale("log")
    right.set_title(r"Scaling per dimension $\theta_i' / \theta_i$")
    right.set_xlabel("dimension pair i")
    right.set_ylabel("ratio to default")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    return _save(fig, path)


def plot_rotations(path, head_dim: int = 128, base: float = 10000.0, train_len: int = 4096,
                   beta_fast: float = 32.0, beta_slow: float = 1.0) -> Path:
    """YaRN rotations ``r_i = L * theta_i / 2pi`` (log y) with the thresholds, YaRN's ramp (paper and HF)
    and the critical dimension ``d_extra`` of arXiv 2310.05209."""
    rot = analysis.yarn_rotations(head_dim, base, train_len, beta_fast, beta_slow)
    d_extra = analysis.critical_dimension(head_dim, base, train_len)
    t_extra = analysis.extrapolation_upper_bound(head_dim, base, train_len)
    fig, (ax,) = _figure(1, width=8.0)
    idx = rot.index.numpy()
    ax.plot(idx, rot.rotations.numpy(), "o-", ms=3, label=r"rotations $r_i = L\,\theta_i / 2\pi$")
    ax.axhline(beta_fast, color="tab:red", ls="--", label=rf"$\beta_{{fast}}$ = {beta_fast:g}")
    ax.axhline(beta_slow, color="tab:purple", ls="--", label=rf"$\beta_{{slow}}$ = {beta_slow:g}")
    ax.axvline(d_extra / 2 - 0.5, color="k", ls=":",
               label=f"critical dim d_extra={d_extra} (T_extra={t_extra:,.0f})")
    ax.set_yscale("log")
    ax.set_title(f"YaRN rotations per dimension (d={head_dim}, base={base:g}, L_train={train_len})")
    ax.set_xlabel("dimension pair i")
    ax.set_ylabel("rotations over L_train")
    ax.grid(alpha=0.3, which="both")
    twin = ax.twinx()
    twin.plot(idx, rot.gamma.numpy(), color="tab:orange", label=r"$\gamma(r_i)$ (paper, linear in r)")
    twin.plot(idx, rot.gamma_hf.numpy(), color="tab:green", ls="-.", label=r"$\gamma$ (HF, linear in i)")
    twin.set_ylabel(r"ramp $\gamma$ (1 = keep, 0 = interpolate)")
    twin.set_ylim(-0.05, 1.05)
    lines, labels = ax.get_legend_handles_labels()
    lines2, labels2 = twin.get_legend_handles_labels()
    twin.legend(lines + lines2, labels + labels2, loc="lower left", fontsize="small")  # on top
    return _save(fig, path)


PLOTS = {"decay": plot_decay, "frequencies": plot_frequencies, "rotations": plot_rotations}


def _show(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def map_title(pm) -> str:
    """``"yarn (factor=4) read at N=256, trained at L=64"`` for a :class:`~posenc.analysis.maps.PositionMap`."""
    params = ", ".join(f"{k}={_show(v)}" for k, v in sorted(pm.params.items()))
    return f"{pm.spec}{f' ({params})' if params else ''} read at N={pm.length}, trained at L={pm.train_len}"


def plot_map(path, spec: str, train_len: int = 64, length: int = 256, params: dict | None = None,
             head_dim: int = 64, base: float = 10000.0, dpi: int = 110) -> Path:
    """Method ``spec``'s position map (:func:`posenc.analysis.maps.position_map`) in three panels: the relative
    position each (query, key) pair is read at (hidden pairs blank; the red line is where it leaves the trained range
    ``L - 1``), the mask (visible pairs dark, causal pairs the method hides orange), and per dimension pair the turns
    over the largest position read at N under the method's schedule against the turns over the trained range under
    plain RoPE (shaded: more than one position past the trained range in a dimension that turned less than once
    there, angles the model never saw in training)."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    from posenc.analysis.maps import position_map

    pm = position_map(spec, train_len, length, params, head_dim=head_dim, base=base)
    fig, (rel_ax, mask_ax, freq_ax) = new_figure(15.6, 4.6, 1, 3)
    fig.suptitle(map_title(pm), fontsize="large")
    n = pm.length
    extent = (-0.5, n - 0.5, n - 0.5, -0.5)
    rel = np.ma.masked_invalid(pm.relative.numpy())
    cmap = colormaps["viridis"].with_extremes(bad="#eeeeee")
    top = max(pm.max_read, train_len - 1, 1)
    img = rel_ax.imshow(rel, cmap=cmap, vmin=0, vmax=top, extent=extent, interpolation="nearest")
    if np.nanmax(pm.relative.numpy(), initial=0.0) > train_len - 1:
        rel_ax.contour(np.arange(n), np.arange(n), rel.filled(0.0), levels=[train_len - 0.5], colors="red",
                       linewidths=1.2)
    bar = fig.colorbar(img, ax=rel_ax, shrink=0.85)
    bar.ax.axhline(train_len - 1, color="red", lw=1.5)
    bar.set_label("relative position read (red: trained range L - 1)")
    rel_ax.set_title("relative position each pair is read at")
    causal_pairs = np.tril(np.ones((n, n), dtype=bool))
    shade = np.where(pm.visible.numpy(), 2, np.where(causal_pairs, 1, 0))  # visible, hidden by the method, future
    mask_ax.imshow(shade, cmap=ListedColormap(["white", "#f4a582", "#222222"]), vmin=0, vmax=2, extent=extent,
                   interpolation="nearest")
    causal = n * (n + 1) // 2
    how = "; keys chosen by content or per head: head 0 on random q, k" if pm.content else ""
    mask_ax.set_title(f"mask: {int(pm.visible.sum())} of {causal} causal pairs visible\n(dark: seen, orange: hidden"
                      f"{how})", fontsize="medium")
    for ax in (rel_ax, mask_ax):
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    turns = pm.turns()
    if turns is None:
        freq_ax.axis("off")
        freq_ax.text(0.5, 0.5, "no rotary part:\nno frequency schedule", ha="center", va="center",
                     fontsize="large", transform=freq_ax.transAxes)
    else:
        at_n, trained = (t.numpy() for t in turns)
        idx = np.arange(at_n.size)
        shown = np.where(at_n > 0, at_n, np.nan)
        freq_ax.plot(idx, trained, "-", color="tab:gray", label=f"trained range: L - 1 = {train_len - 1}, plain RoPE")
        freq_ax.plot(idx, shown, "o-", ms=3, color="tab:blue",
                     label=f"largest position read at N: {pm.max_read:.4g}, this method's schedule")
        freq_ax.axhline(1.0, color="k", ls=":", lw=1, label="one turn (every angle seen)")
        # more than one position past the trained range, in a dimension that turned less than once in training
        unseen = (at_n > trained * train_len / max(train_len - 1, 1) * (1 + 1e-9)) & (trained < 1)
        if unseen.any():
            freq_ax.fill_between(idx, trained, np.where(unseen, shown, trained), where=unseen, color="tab:red",
                                 alpha=0.25, label=f"angles never seen in training ({int(unseen.sum())} pairs)")
        freq_ax.set_yscale("log")
        freq_ax.set_xlabel("dimension pair i")
        freq_ax.set_ylabel("turns (rotation / 2 pi)")
        freq_ax.grid(alpha=0.3, which="both")
        freq_ax.legend(fontsize="small", loc="lower left")
        freq_ax.set_title("frequency schedule against the trained range")
    return _save(fig, path, dpi)
