"""posenc.analysis.rope: closed-form curves of RoPE (critical dimension, long-range decay, inner products, YaRN's
rotations and ramp), hand-computed numbers and HF's YaRN ramp."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from posenc._util import assert_close
from posenc.analysis import rope as analysis


# ---------------------------------------------------------------------------------------- scaling laws
def test_critical_dimension_llama2_matches_paper():
    # arXiv 2310.05209: LLaMA2 d=128, base=10000, L=4096 -> d_extra = 92.
    # By hand: log(4096 / 2pi) / log(10000) = 6.47996 / 9.21034 = 0.703550; * 64 = 45.027 -> ceil 46 -> 92
    assert analysis.critical_dimension(128, 10000, 4096) == 92
    # T_extra = 2 pi * 10000^(92/128) = 2 pi * 10^2.875 = 6.283185 * 749.894 = 4711.72
    assert analysis.extrapolation_upper_bound(128, 10000, 4096) == pytest.approx(4711.7243, rel=1e-7)
    assert analysis.extrapolation_upper_bound(128, 10000, 4096) == pytest.approx(
        2 * math.pi * 10 ** 2.875, rel=1e-12)


@pytest.mark.parametrize("head_dim,base,train_len,d_extra,t_extra", [
    # LLaMA3-like: 64 * log(8192/2pi)/log(5e5) = 34.984 -> 35 -> 70; 2pi * 5e5^(70/128) = 8218.72
    (128, 500000.0, 8192, 70, 8218.7182),
    # 32 * log(512/2pi)/log(1e4) = 15.289 -> 16 -> 32; 2pi * 10000^(1/2) = 628.3185
    (64, 10000.0, 512, 32, 200 * math.pi),
    # 64 * log(4096/2pi)/log(1e6) = 30.018 -> 31 -> 62; 2pi * 1e6^(62/128) = 5063.256
    (128, 1e6, 4096, 62, 5063.2558),
])
def test_critical_dimension_by_hand(head_dim, base, train_len, d_extra, t_extra):
    assert analysis.critical_dimension(head_dim, base, train_len) == d_extra
    assert analysis.extrapolation_upper_bound(head_dim, base, train_len) == pytest.approx(t_extra, rel=1e-7)


def test_critical_dimension_clipped_and_periods():
    assert analysis.critical_dimension(64, 10000, 4) == 0  # shorter than one turn of the fastest pair
    assert analysis.critical_dimension(64, 2.0, 10 ** 6) == 64  # every pair turned within L
    # the pairs below d_extra/2 have period <= L, the next one does not
    d_extra = analysis.critical_dimension(128, 10000, 4096)
    period = 2 * math.pi / analysis.default_inv_freq(128, 10000)
    assert (period[: d_extra // 2] <= 4096).all() and period[d_extra // 2] > 4096


# ---------------------------------------------------------------------------------------- decay curves
def test_rope_decay_curve_starts_at_max_and_decays():
    d = 128
    curve = analysis.rope_decay_curve(d, 1000)
    assert curve.distance.shape == curve.upper_bound.shape == curve.inner_product.shape == (1001,)
    # r = 0: S_j = j, so (1/(d/2)) sum_{j=1}^{d/2} j = (d/2 + 1) / 2 = 32.5; inner product 1
    assert curve.upper_bound[0].item() == pytest.approx(32.5, rel=1e-12)
    assert curve.upper_bound.max().item() == curve.upper_bound[0].item()
    assert curve.inner_product[0].item() == pytest.approx(1.0, rel=1e-12)
    assert curve.inner_product.abs().max().item() == pytest.approx(1.0, rel=1e-12)
    means = [curve.upper_bound[a:b].mean().item() for a, b in [(1, 50), (50, 200), (200, 500), (500, 1001)]]
    assert means == sorted(means, reverse=True), means  # decays on average
    assert means[-1] < 0.3 * curve.upper_bound[0].item()
    inner = [curve.inner_product[a:b].mean().item() for a, b in [(1, 50), (200, 500), (500, 1001)]]
    assert inner == sorted(inner, reverse=True), inner


def test_rope_decay_curve_by_hand_and_options():
    # d = 4, base = 100: theta = [1, 0.1]; r = 1: S_1 = e^{i}, S_2 = e^{i} + e^{0.1 i}
    curve = analysis.rope_decay_curve(4, 3, base=100.0)
    s2 = complex(math.cos(1) + math.cos(0.1), math.sin(1) + math.sin(0.1))
    assert curve.upper_bound[1].item() == pytest.approx((1 + abs(s2)) / 2, rel=1e-12)
    assert curve.inner_product[1].item() == pytest.approx((math.cos(1) + math.cos(0.1)) / 2, rel=1e-12)
    # explicit inv_freq == the default schedule; chunking does not change the result
    same = analysis.rope_decay_curve(64, 300, inv_freq=analysis.default_inv_freq(64, 10000.0), chunk=7)
    ref = analysis.rope_decay_curve(64, 300)
    assert_close(same.upper_bound, ref.upper_bound, rtol=1e-12, atol=1e-12)
    assert_close(same.inner_product, ref.inner_product, rtol=1e-12, atol=1e-12)


def test_inner_product_is_rope_score_of_all_ones():
    d, r = 16, 37
    theta = analysis.default_inv_freq(d, 10000.0)
    q = k = torch.ones(d, dtype=torch.float64)
    qc, kc = torch.complex(q[0::2], q[1::2]), torch.complex(k[0::2], k[1::2])  # pairs as complex numbers
    score = (qc * torch.polar(torch.ones_like(theta), r * theta) * kc.conj()).real.sum()  # q . R_r k
    curve = analysis.rope_decay_curve(d, r)
    assert curve.inner_product[r].item() == pytest.approx(score.item() / d, rel=1e-12)


def test_sinusoidal_inner_product_equals_table_dot():
    dim, n = 32, 200
    w = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    pos = torch.arange(n + 1, dtype=torch.float64)
    table = torch.stack([torch.sin(pos[:, None] * w), torch.cos(pos[:, None] * w)], -1).flatten(1)  # [n+1, d]
    expect = table @ table[0]
    got = analysis.sinusoidal_inner_product(dim, n)
    assert_close(got, expect, rtol=1e-12, atol=1e-12)
    assert got[0].item() == dim / 2


# ---------------------------------------------------------------------------------------- YaRN
def test_yarn_rotations_by_hand():
    rot = analysis.yarn_rotations(128, 10000.0, 4096)
    # r_0 = 4096 / 2pi = 651.8986; r_i = r_0 * 10000^(-2i/128)
    assert rot.rotations[0].item() == pytest.approx(651.898647, rel=1e-8)
    assert rot.rotations[32].item() == pytest.approx(651.898647 / 100, rel=1e-8)
    # r crosses beta_slow = 1 exactly at the critical dimension (i = 45 -> r > 1, i = 46 -> r < 1)
    assert rot.rotations[45].item() > 1 > rot.rotations[46].item()
    assert rot.gamma[45].item() > 0 and rot.gamma[46].item() == 0
    assert rot.low == 20 and rot.high == 46  # floor(20.94), ceil(45.03)


def test_yarn_ramp_by_hand():
    r = torch.tensor([0.5, 1.0, 16.5, 32.0, 40.0])
    assert_close(analysis.yarn_ramp(r, 32, 1), torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0]).double(), rtol=0,
                 atol=1e-15)
    with pytest.raises(ValueError, match="beta_fast"):
        analysis.yarn_ramp(r, beta_fast=1.0, beta_slow=2.0)


@pytest.mark.parametrize("head_dim,base,train_len,factor", [(128, 10000.0, 4096, 4.0), (64, 500000.0, 2048, 8.0)])
def test_yarn_gamma_hf_reproduces_hf_inv_freq(head_dim, base, train_len, factor):
    config = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2,
                         max_position_embeddings=int(train_len * factor),
                         rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": factor,
                                          "original_max_position_embeddings": train_len})
    hf_inv, _ = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    rot = analysis.yarn_rotations(head_dim, base, train_len)
    ours = rot.inv_freq * (rot.gamma_hf + (1 - rot.gamma_hf) / factor)  # (1-g) theta/s + g theta
    assert_close(ours.float(), hf_inv, rtol=1e-5, atol=0)


# ---------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("call,match", [
    (lambda: analysis.critical_dimension(127, 10000, 4096), "head_dim"),
    (lambda: analysis.critical_dimension(128, 1.0, 4096), "base"),
    (lambda: analysis.critical_dimension(128, 10000, 0), "train_len"),
    (lambda: analysis.rope_decay_curve(128, 0), "max_distance"),
    (lambda: analysis.rope_decay_curve(128, 10, inv_freq=torch.tensor([float("nan")])), "inv_freq"),
    (lambda: analysis.sinusoidal_inner_product(15, 10), "dim"),
    (lambda: analysis.yarn_rotations(128, 10000, 4096, beta_slow=0.0), "beta_slow"),
])
def test_validation_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
