"""Score biases (posenc.parts.biases): equality with HF (BLOOM ALiBi, T5 buckets), hand-computed cases from the
papers (ALiBi through the engine, FIRE on a 3 x 3 case), gradients, the elementwise/0-d contract that
FlexAttention's score_mod relies on, translation invariance as declared, and validation."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.t5.modeling_t5 import T5Attention

from posenc import PositionScheme, attention
from posenc._util import assert_close
from posenc.engine import run_attention
from posenc.engine.parts import AttentionParts
from posenc.parts.biases import (
    BIASES,
    ALiBiBias,
    KerpleLogBias,
    KerplePowerBias,
    SandwichBias,
    ScoreBias,
    T5Bias,
    alibi_slopes,
    build_bias,
    t5_relative_bucket,
)
from tests.support.attention import _causal, _qkv, _softmax_attend
from tests.support.tiny_lm import _scheme

torch.manual_seed(0)


def test_alibi_4x4_equals_formula():
    H, N, D = 2, 4, 8
    q, k, v = _qkv(B=1, H=H, N=N, D=D)
    s = PositionScheme.preset("alibi")
    out = attention(q, k, v, s, impl="reference")
    slopes = torch.tensor([2 ** -4, 2 ** -8])  # 2 heads: 2^(-8/2 * (h+1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    i = torch.arange(N)
    bias = -slopes[:, None, None] * (i[:, None] - i[None]).float()
    ref = _softmax_attend(scores + bias, v, _causal(N))
    assert_close(out, ref, rtol=1e-6, atol=1e-6)

KWARGS = {"sandwich": {"dim": 16}, "fire": {"hidden": 4}}  # small d' and MLP keep the unrolled sums short in tests


def _make(name: str, num_heads: int) -> ScoreBias:
    return BIASES[name](num_heads, **KWARGS.get(name, {}))


# ---------------------------------------------------------------------------------------- ALiBi
@pytest.mark.parametrize("num_heads", range(1, 65))
def test_alibi_slopes_match_bloom(num_heads):
    seq = 9
    hf = build_alibi_tensor(torch.ones(1, seq, dtype=torch.long), num_heads, torch.float32)  # [H,1,seq]
    assert_close(alibi_slopes(num_heads), hf[:, 0, 1], rtol=1e-6, atol=0, name="slopes")
    ours = alibi_slopes(num_heads)[:, None, None] * torch.arange(seq, dtype=torch.float32)  # [H,1,seq]
    assert_close(ours, hf, rtol=1e-6, atol=0, name="alibi tensor")


def test_alibi_slopes_paper_examples():
    # Press et al.: 8 heads -> 1/2, 1/4, ..., 1/256; seed 000: 16 heads -> 2^-0.5, 2^-1, ..., 2^-8
    assert_close(alibi_slopes(8), torch.tensor([2.0 ** -k for k in range(1, 9)]), rtol=0, atol=0)
    assert_close(alibi_slopes(16), torch.tensor([2.0 ** (-k / 2) for k in range(1, 17)]), rtol=1e-7)
    # 12 heads: 8-head slopes, then every other slope of 16 heads: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    expect = [2.0 ** -k for k in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
    assert_close(alibi_slopes(12), torch.tensor(expect), rtol=1e-7)


def test_alibi_bias_4x4_by_hand():
    bias = ALiBiBias(2)  # slopes 2^-4, 2^-8
    dist = torch.tensor([[0.0, 1, 2, 3],
                         [1, 0, 1, 2],
                         [2, 1, 0, 1],
                         [3, 2, 1, 0]])
    expect = -torch.stack([dist / 16, dist / 256])[None]  # [1,2,4,4]
    assert_close(bias(torch.arange(4), torch.arange(4)), expect, rtol=0, atol=0)
    # only differences matter: positions 100..103 give the same matrix
    assert_close(bias(torch.arange(100, 104), torch.arange(100, 104)), expect, rtol=0, atol=0)


def test_alibi_bias_equals_bloom_up_to_row_constant():
    # BLOOM adds +slope*k; ours is -slope*(q-k): same softmax on the causal part (differ by slope*q per row)
    H, N = 6, 7
    ours = ALiBiBias(H)(torch.arange(N), torch.arange(N))[0]  # [H,N,N]
    bloom = build_alibi_tensor(torch.ones(1, N, dtype=torch.long), H, torch.float32)  # [H,1,N]
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    shift = (bloom - ours).masked_fill(~causal, 0)  # [H,N,N]
    row_const = alibi_slopes(H)[:, None, None] * torch.arange(N, dtype=torch.float32)[None, :, None]
    assert_close(shift, row_const.expand(H, N, N).masked_fill(~causal, 0), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------- T5
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 256), (8, 20), (16, 1000), (4, 3)])
def test_t5_bucket_matches_hf(bidirectional, num_buckets, max_distance):
    rel = torch.cat([torch.arange(-2000, 2001),
                     torch.tensor([-(2 ** 40), -(10 ** 6), -65537, 65537, 10 ** 6, 2 ** 40])])
    hf = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                               max_distance=max_distance)
    ours = t5_relative_bucket(rel, bidirectional, num_buckets, max_distance)
    assert ours.dtype == torch.long
    assert torch.equal(ours, hf), (ours != hf).nonzero()[:5]


def test_t5_bias_indexes_table_by_bucket_of_key_minus_query():
    torch.manual_seed(0)
    bias = T5Bias(3, num_buckets=8, max_distance=20, bidirectional=True)
    qp, kp = torch.arange(5, 30), torch.arange(0, 40)
    got = bias(qp, kp)[0]  # [H,Nq,Nk]
    bucket = t5_relative_bucket(kp[None, :] - qp[:, None], True, 8, 20)  # [Nq,Nk]
    assert_close(got, bias.weight[bucket].permute(2, 0, 1), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------- KERPLE
def _set(param: torch.nn.Parameter, values):
    with torch.no_grad():
        param.copy_(torch.tensor(values))


def test_kerple_power_by_hand():
    bias = KerplePowerBias(2)
    _set(bias.r1, [0.5, 2.0])
    _set(bias.r2, [1.5, 0.5])
    row = bias(torch.tensor([3]), torch.arange(4))[0, :, 0]  # distances 3, 2, 1, 0
    # head 0: -0.5 * d^1.5; head 1: -2 * sqrt(d)
    expect = torch.tensor([[-2.59807621, -1.41421356, -0.5, 0.0],
                           [-3.46410162, -2.82842712, -2.0, 0.0]])
    assert_close(row, expect, rtol=1e-6, atol=1e-7)


def test_kerple_log_by_hand():
    bias = KerpleLogBias(2)
    _set(bias.r1, [1.0, 0.5])
    _set(bias.r2, [1.0, 2.0])
    row = bias(torch.tensor([3]), torch.arange(4))[0, :, 0]  # distances 3, 2, 1, 0
    # head 0: -log(1 + d); head 1: -0.5 * log(1 + 2d)
    expect = torch.tensor([[-1.38629436, -1.09861229, -0.69314718, 0.0],
                           [-0.97295507, -0.80471896, -0.54930614, 0.0]])
    assert_close(row, expect, rtol=1e-6, atol=1e-7)


def test_kerple_power_with_r2_one_is_alibi():
    bias = KerplePowerBias(2)
    _set(bias.r1, [0.5, 0.25])  # ALiBi slopes of 2**-1, 2**-2 (KERPLE's eps = 0.01 bounds r1 below)
    _set(bias.r2, [1.0, 1.0])
    pos = torch.arange(12)
    alibi = ALiBiBias(2)
    alibi.slopes = torch.tensor([0.5, 0.25])
    assert_close(bias(pos, pos), alibi(pos, pos), rtol=1e-6, atol=1e-7)


def test_kerple_constraints_clamp_and_project():
    power, log = KerplePowerBias(1), KerpleLogBias(1)
    _set(power.r1, [-1.0])  # -> eps
    _set(power.r2, [3.0])  # -> 2
    row = power(torch.tensor([2]), torch.arange(3))[0, 0, 0]
    assert_close(row, torch.tensor([-0.01 * 4.0, -0.01, 0.0]), rtol=1e-6, atol=1e-8)
    _set(log.r1, [0.0])
    _set(log.r2, [-5.0])
    assert_close(torch.stack(log.coefficients()).detach(), torch.tensor([[0.01], [0.01]]), rtol=0, atol=0)
    power.project_()
    log.project_()
    assert power.r1.item() == pytest.approx(0.01) and power.r2.item() == 2.0
    assert log.r1.item() == pytest.approx(0.01) and log.r2.item() == pytest.approx(0.01)


def test_kerple_init_ranges_as_in_paper_code():
    torch.manual_seed(0)
    power, log = KerplePowerBias(256), KerpleLogBias(256)
    for param, hi in [(power.r1, 1), (power.r2, 2), (log.r1, 2), (log.r2, 1)]:
        assert 0 <= param.min() and param.max() <= hi and param.max() > 0.8 * hi


# ---------------------------------------------------------------------------------------- Sandwich
def test_sandwich_by_hand():
    # d' = 4: frequencies 10000^(-2/4) = 0.01 and 10000^(-4/4) = 1e-4; lam_h = H / (8h) = [0.25, 0.125]
    bias = SandwichBias(2, dim=4)
    got = bias(torch.tensor([100]), torch.tensor([0, 97, 100, 103]))[0, :, 0]  # distances 100, 3, 0, -3
    s100 = math.cos(1.0) + math.cos(0.01) - 2  # = -0.45974769...
    s3 = math.cos(0.03) + math.cos(0.0003) - 2  # = -0.00045001...
    assert s100 == pytest.approx(-0.4597476937) and s3 == pytest.approx(-0.0004500113)
    expect = torch.tensor([[0.25 * s100, 0.25 * s3, 0.0, 0.25 * s3],
                           [0.125 * s100, 0.125 * s3, 0.0, 0.125 * s3]])
    assert_close(got, expect, rtol=1e-5, atol=1e-9)


def test_sandwich_equals_sinusoidal_inner_product_and_reference_form():
    dim, H, N = 32, 4, 50
    bias = SandwichBias(H, dim=dim, lam=1.0)
    pos = torch.arange(N)
    # lam * (p_m . p_n - d'/2) with p from the sin/cos table using frequencies i = 1..d'/2
    w = 10000.0 ** (-2 * torch.arange(1, dim // 2 + 1, dtype=torch.float64) / dim)
    angle = pos[:, None].double() * w  # [N, d'/2]
    p = torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)  # [N, d']
    expect = (p @ p.T - dim / 2).float()
    assert_close(bias(pos, pos)[0], expect.expand(H, N, N), rtol=1e-5, atol=1e-5)
    # per-head default lam = H / (8 h): the reference code divides by (h * 8 / H)
    default = SandwichBias(H, dim=dim)(pos, pos)[0]
    scale = torch.arange(1, H + 1, dtype=torch.float32)[:, None, None] * 8 / H
    assert_close(default, expect.expand(H, N, N) / scale, rtol=1e-5, atol=1e-6)


def test_sandwich_lambda_forms():
    pos = torch.arange(6)
    one = SandwichBias(3, dim=8, lam=0.5)(pos, pos)
    seq = SandwichBias(3, dim=8, lam=[0.5, 1.0, 2.0])(pos, pos)
    assert_close(seq, one * torch.tensor([1.0, 2.0, 4.0])[None, :, None, None], rtol=1e-6, atol=1e-7)
    assert (one <= 0).all() and (one.diagonal(dim1=-2, dim2=-1) == 0).all()


# ---------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("cls", [KerplePowerBias, KerpleLogBias])
def test_gradients_reach_kerple_parameters(cls):
    torch.manual_seed(0)
    bias = cls(3)
    pos = torch.arange(10)
    (bias(pos, pos) ** 2).sum().backward()
    for param in (bias.r1, bias.r2):
        assert param.grad is not None and torch.isfinite(param.grad).all() and (param.grad != 0).all()


def test_gradients_reach_t5_table_exactly():
    bias = T5Bias(2, num_buckets=8, max_distance=16)
    qp, kp = torch.stack([torch.arange(20), torch.arange(20) + 7]), torch.arange(30)
    bias(qp, kp).sum().backward()
    bucket = t5_relative_bucket(kp[None, None, :] - qp[:, :, None], False, 8, 16)  # [B,Nq,Nk]
    counts = torch.bincount(bucket.flatten(), minlength=8).float()  # d(sum)/d weight[b, h] = #uses of b
    assert_close(bias.weight.grad, counts[:, None].expand(8, 2), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize("name", sorted(BIASES))
def test_score_on_0d_tensors_equals_materialised_entry(name):
    torch.manual_seed(1)
    H = 3
    bias = _make(name, H)
    q_pos = torch.tensor([[0, 1, 2, 3, 4], [40, 41, 45, 46, 200]])  # ragged rows
    k_pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 40, 41, 300, 1000]])
    full = bias(q_pos, k_pos)
    assert full.shape == (2, H, 5, 7) and full.dtype == torch.float32
    got = torch.empty_like(full)
    for b in range(2):
        for h in range(H):
            for i in range(5):
                for j in range(7):
                    val = bias.score(torch.tensor(h), q_pos[b, i], k_pos[b, j])
                    assert val.dim() == 0
                    got[b, h, i, j] = val
    assert_close(got, full, rtol=1e-6, atol=1e-7, name=name)


@pytest.mark.parametrize("name", sorted(BIASES))
def test_score_as_flex_attention_score_mod(name):
    """Eager FlexAttention (vmapped score_mod) with ``score + bias.score(...)`` == materialised reference."""
    from torch.nn.attention.flex_attention import flex_attention

    torch.manual_seed(2)
    B, H, N, D = 2, 2, 8, 4
    bias = _make(name, H)
    q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
    pos = torch.stack([torch.arange(N), torch.arange(N) * 3 + 50])

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias.score(h, pos[b, q_idx], pos[b, kv_idx])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex_attention(q, k, v, score_mod=score_mod)
    ref = ((q @ k.transpose(-1, -2)) / math.sqrt(D) + bias(pos, pos)).softmax(-1) @ v
    assert_close(out, ref, rtol=1e-5, atol=1e-5, name=name)


def _hand_bias(name, h, d):
    """The bias of head h at distance d = qp - kp for the parameters set in the test below, from the papers'
    formulas with the numbers written out."""
    if name == "alibi":  # 2 heads: slopes 2^-4, 2^-8
        return -[2 ** -4, 2 ** -8][h] * abs(d)
    if name == "kerple_power":  # -r1 |d|^r2
        return -[0.5, 2.0][h] * abs(d) ** [1.5, 0.5][h]
    if name == "kerple_log":  # -r1 log(1 + r2 |d|)
        return -[0.5, 2.0][h] * math.log(1 + [1.5, 0.5][h] * abs(d))
    if name == "t5":  # bidirectional, 16 buckets -> 8 per side, exact below 4: kp - qp = -2..2 -> 2 1 0 9 10
        bucket = {2: 2, 1: 1, 0: 0, -1: 9, -2: 10}[d]
        return 100.0 * bucket + h  # weight[bucket, h] set to 100 bucket + h
    if name == "sandwich":  # lam_h (sum_{i=1}^{d'/2} cos(d / base^(2i/d')) - d'/2), d' = 4, lam = 3.0
        return 3.0 * (math.cos(d / 100.0) + math.cos(d / 10000.0) - 2)
    if name == "fire":  # b2_h + w2_h relu(w1 x + b1), x = log(1 + c|d|) / log(1 + c max(L, i)); c = 1, L = 10 > i
        return [0.0, 0.5][h] + [1.0, 2.0][h] * math.log1p(abs(d)) / math.log(11.0)
    raise AssertionError(name)


BUILD = {"alibi": {}, "kerple_power": {}, "kerple_log": {}, "t5": {"num_buckets": 16, "bidirectional": True},
         "sandwich": {"dim": 4, "lam": 3.0}, "fire": {"hidden": 1, "c": 1.0, "threshold": 10.0}}


@pytest.mark.parametrize("name", sorted(BIASES))
def test_registry_builds_each_bias_with_its_options_and_values(name):
    bias = build_bias(name, 2, **BUILD[name])
    assert isinstance(bias, BIASES[name]) and bias.num_heads == 2
    with torch.no_grad():
        if name.startswith("kerple"):
            bias.r1.copy_(torch.tensor([0.5, 2.0]))
            bias.r2.copy_(torch.tensor([1.5, 0.5]))
        if name == "t5":
            bias.weight.copy_(100.0 * torch.arange(16.0)[:, None] + torch.arange(2.0))
        if name == "fire":
            bias.w1.fill_(1.0), bias.b1.fill_(0.0)
            bias.w2.copy_(torch.tensor([[1.0], [2.0]])), bias.b2.copy_(torch.tensor([0.0, 0.5]))
        got = bias(torch.arange(3), torch.arange(3))  # [1, 2, 3, 3]: every distance -2..2
    expected = torch.tensor([[[_hand_bias(name, h, i - j) for j in range(3)] for i in range(3)] for h in range(2)])
    assert_close(got[0], expected, rtol=1e-6, atol=1e-7, name=name)


def test_registry_knows_each_bias_and_passes_options():
    assert set(BIASES) == {"alibi", "kerple_power", "kerple_log", "t5", "sandwich", "fire"}
    assert set(BUILD) == set(BIASES)
    assert build_bias("t5", 2, num_buckets=16).num_buckets == 16


# ---------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("name", sorted(BIASES))
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_num_heads_validation(name, bad):
    with pytest.raises(ValueError, match="num_heads"):
        BIASES[name](bad)


@pytest.mark.parametrize("call,match", [
    (lambda: alibi_slopes(0), "num_heads"),
    (lambda: t5_relative_bucket(torch.arange(3), True, 3), "num_buckets"),
    (lambda: t5_relative_bucket(torch.arange(3), False, 1), "num_buckets"),
    (lambda: t5_relative_bucket(torch.arange(3), True, 32, 8), "max_distance"),
    (lambda: t5_relative_bucket(torch.arange(3.0)), "relative_position"),
    (lambda: t5_relative_bucket(torch.arange(3), "yes"), "bidirectional"),
    (lambda: T5Bias(2, num_buckets=1), "num_buckets"),
    (lambda: T5Bias(2, init_std=-1.0), "init_std"),
    (lambda: SandwichBias(2, dim=3), "dim"),
    (lambda: SandwichBias(2, dim=0), "dim"),
    (lambda: SandwichBias(2, base=1.0), "base"),
    (lambda: SandwichBias(2, lam=-1.0), "lam"),
    (lambda: SandwichBias(2, lam=float("nan")), "lam"),
    (lambda: SandwichBias(2, lam=[1.0]), "lam"),
    (lambda: build_bias("rope", 2), "bias"),
    (lambda: ALiBiBias(2)(torch.arange(3.0), torch.arange(3)), "positions"),
])
def test_validation_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ============================================================================ FIRE
def test_fire_bias_equals_the_formula_on_a_hand_computed_3x3_case():
    """bias(i, j) = f(psi(|i-j|) / psi(max(L, i))), psi(x) = log(c x + 1), with c = 1, L = 1.5 and a
    2-unit MLP f(x) = 0.1 + 2 relu(x) + 3 relu(0.5 - x). By hand (ln 2 = 0.693147, ln 2.5 = 0.916291,
    ln 3 = 1.098612):
      i = 0, 1: normaliser ln(1 + 1.5) = 0.916291;  i = 2: ln(1 + 2) = 1.098612
      x(1,0) = x(0,1) = x(1,2) = 0.693147 / 0.916291 = 0.756471   -> f = 0.1 + 2 * 0.756471 = 1.612942
      x(0,2) = 1.098612 / 0.916291 = 1.198978                      -> f = 0.1 + 2 * 1.198978 = 2.497956
      x(2,0) = 1.098612 / 1.098612 = 1                             -> f = 2.1
      x(2,1) = 0.693147 / 1.098612 = 0.630930                      -> f = 0.1 + 2 * 0.630930 = 1.361860
      x(i,i) = 0                                                   -> f = 0.1 + 3 * 0.5 = 1.6"""
    from posenc.parts.biases import FireBias

    bias = FireBias(1, hidden=2, c=1.0, threshold=1.5)
    with torch.no_grad():
        bias.w1.copy_(torch.tensor([1.0, -1.0]))
        bias.b1.copy_(torch.tensor([0.0, 0.5]))
        bias.w2.copy_(torch.tensor([[2.0, 3.0]]))
        bias.b2.copy_(torch.tensor([0.1]))
    expected = torch.tensor([[1.6, 1.612942, 2.497956],
                             [1.612942, 1.6, 1.612942],
                             [2.1, 1.361860, 1.6]])
    assert_close(bias(torch.arange(3), torch.arange(3))[0, 0], expected, rtol=0, atol=2e-6, name="FIRE bias")
    # through the engine: softmax(q.k / sqrt(D) + bias) over the causal keys
    parts = AttentionParts(_scheme("fire", hidden=2, c=1.0, threshold=1.5), 1, 4)
    parts.bias.load_state_dict(bias.state_dict())
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 1, 3, 4) for _ in range(3))
    logits = (q @ k.transpose(-1, -2)) / 2.0 + expected
    logits = logits.masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))
    for impl in ("reference", "sdpa", "blockwise"):
        with torch.no_grad():
            got = run_attention(parts, q, k, v, impl=impl)
        assert_close(got, torch.softmax(logits, -1) @ v, rtol=1e-5, atol=1e-6, name=impl)


def test_fire_parameters_are_checked():
    with pytest.raises(ValueError, match="fire.c"):
        _scheme("fire", c=0.0)
    with pytest.raises(ValueError, match="fire.threshold"):
        _scheme("fire", threshold=0.5)
    with pytest.raises(ValueError, match="does not take"):
        _scheme("fire", slope=1.0)
    assert _scheme("fire", train_len=48).bias.params == {"threshold": 48.0}


# biases that are a function of the distance alone (FIRE normalises by the query position: it is not)
INVARIANT = sorted(n for n, cls in BIASES.items() if cls(num_heads=3).translation_invariant)


def test_only_fire_depends_on_more_than_the_distance():
    assert sorted(set(BIASES) - set(INVARIANT)) == ["fire"]


@pytest.mark.parametrize("name", INVARIANT)
def test_translation_invariant_biases_have_a_distance_profile(name):
    """Every bias that declares itself translation invariant is: shifting both positions changes
    nothing, and the profile is the bias at (d, 0)."""
    torch.manual_seed(0)
    bias = BIASES[name](num_heads=3)
    qp = torch.randint(0, 3000, (50,))
    kp = qp - torch.randint(0, 400, (50,)).clamp(max=qp)
    h = torch.arange(3)[:, None]
    with torch.no_grad():
        a = bias.score(h, qp[None], kp[None])
        b = bias.score(h, qp[None] + 12345, kp[None] + 12345)
        prof = bias.distance_profile(3000)
    torch.testing.assert_close(a.expand(3, 50), b.expand(3, 50), rtol=0, atol=0)
    torch.testing.assert_close(prof[:, qp - kp], a.expand(3, 50), rtol=1e-6, atol=1e-6)
