"""Pictures of RoPE's closed-form curves, drawn from :mod:`posenc.analysis` (matplotlib, Agg, no pyplot state).

- :func:`plot_decay`: RoPE long-range decay (RoFormer bound + all-ones inner product) and the
  sinusoidal ``p_0 . p_r``.
- :func:`plot_frequencies`: ``inv_freq`` per dimension for default / linear (PI) / NTK / YaRN schedules
  (from ``posenc.parts.frequencies.rope_frequencies``) and their ratio to the default.
- :func:`plot_rotations`: YaRN rotations ``r_i`` with the ``beta_fast``/``beta_slow`` thresholds, the
  ramp, and the critical dimension of arXiv 2310.05209.

Command line (:mod:`posenc.cli.plot`):
``posenc plot {decay,frequencies,rotations} --out FILE.png [--head-dim --base --train-len]``.
"""

from __future__ import annotations

from pathlib import Path

from posenc._figures import new_figure, save_png
from posenc._util import check_finite
from posenc.analysis import rope as analysis

__all__ = ["PLOTS", "plot_decay", "plot_frequencies", "plot_rotations"]


def _figure(ncols: int = 1, width: float = 6.4):
    return new_figure(width * ncols, 4.4, 1, ncols)


def _save(fig, path) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"out must be a .png file, got {str(path)!r}")
    if not path.parent.is_dir():  # never create folders (a typo would make them from the root)
        raise ValueError(f"out folder {str(path.parent)!r} does not exist; create it first")
    return save_png(fig, path, dpi=110)


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
