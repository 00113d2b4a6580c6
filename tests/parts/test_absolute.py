"""Absolute position embeddings: seed formulas by hand, table extension, FLOATER, complex order, registry."""

from __future__ import annotations

import math

import pytest
import torch

from posenc._util import assert_close
from posenc.parts.absolute import (
    EMBEDDINGS,
    ComplexOrderEmbedding,
    FloaterEmbedding,
    HierarchicalEmbedding,
    LearnedEmbedding,
    NoPositionEmbedding,
    SinusoidalEmbedding,
    build_embedding,
    sinusoidal_table,
)


@pytest.mark.parametrize("num_positions,dim,base", [(50, 16, 10000.0), (7, 2, 10000.0), (33, 10, 100.0)])
def test_sinusoidal_table_matches_seed_formula(num_positions, dim, base):
    expected = torch.zeros(num_positions, dim, dtype=torch.float64)
    for t in range(num_positions):
        for i in range(dim // 2):
            expected[t, 2 * i] = math.sin(t / base ** (2 * i / dim))
            expected[t, 2 * i + 1] = math.cos(t / base ** (2 * i / dim))
    table = sinusoidal_table(num_positions, dim, base)
    assert table.dtype == torch.float32
    assert_close(table, expected, rtol=0, atol=1e-7, name="sinusoidal table")


def test_sinusoidal_embedding_adds_table_per_row_and_far():
    torch.manual_seed(0)
    emb = SinusoidalEmbedding(8)
    x = torch.randn(2, 4, 8)
    pos = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13]])
    table = sinusoidal_table(20, 8)
    assert_close(emb(x, pos), x + table[pos], rtol=0, atol=1e-6, name="sinusoidal forward")
    # far positions: float64 angles, equal to the formula
    far = torch.tensor([10**6, 10**7 + 3])
    ref = torch.tensor([[math.sin(p), math.cos(p)] for p in far.tolist()])  # i = 0: frequency 1
    assert_close(emb(torch.zeros(1, 2, 8), far)[0, :, :2], ref, rtol=0, atol=1e-6, name="far")


def test_nope_returns_x():
    x = torch.randn(2, 3, 4)
    assert torch.equal(NoPositionEmbedding()(x, torch.arange(3)), x)
    assert NoPositionEmbedding().max_positions is None


def test_learned_embedding_inside_and_beyond_table():
    torch.manual_seed(1)
    emb = LearnedEmbedding(4, max_positions=8)
    x = torch.randn(2, 3, 4)
    pos = torch.tensor([[0, 1, 7], [5, 6, 7]])
    assert_close(emb(x, pos), x + emb.table[pos], name="learned")
    with pytest.raises(ValueError, match=r"position 9 is beyond the learned table \(8\).*hierarchical"):
        emb(x, torch.tensor([0, 1, 9]))


def test_hierarchical_loads_learned_checkpoint_and_extends():
    torch.manual_seed(2)
    n, dim, alpha = 6, 5, 0.4
    learned = LearnedEmbedding(dim, max_positions=n)
    hier = HierarchicalEmbedding(dim, max_positions=n, alpha=alpha)
    hier.load_state_dict(learned.state_dict(), strict=True)  # same parameter name and shape
    assert hier.max_positions == n * n and hier.table_size == n
    x = torch.randn(1, n, dim)
    assert torch.equal(hier(x, torch.arange(n)), learned(x, torch.arange(n)))  # first n: exactly p
    # q_{i n + j} = alpha u_i + (1 - alpha) u_j, u_i = (p_i - alpha p_0) / (1 - alpha), by hand
    p = learned.table.detach().double()
    for i, j in [(1, 0), (2, 3), (5, 5), (0, 4)]:
        u_i = (p[i] - alpha * p[0]) / (1 - alpha)
        u_j = (p[j] - alpha * p[0]) / (1 - alpha)
        expected = alpha * u_i + (1 - alpha) * u_j
        got = hier(torch.zeros(1, 1, dim), torch.tensor([i * n + j]))[0, 0]
        assert_close(got, expected, rtol=1e-5, atol=1e-6, name=f"q_({i}*n+{j})")
    out = hier(torch.zeros(1, n * n, dim), torch.arange(n * n))  # the whole n^2 range works
    assert out.shape == (1, n * n, dim)
    with pytest.raises(ValueError, match="hierarchical extension"):
        hier(torch.zeros(1, 1, dim), torch.tensor([n * n]))


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.2, 1.5, float("nan")])
def test_hierarchical_alpha_validation(alpha):
    with pytest.raises(ValueError, match="alpha"):
        HierarchicalEmbedding(4, 8, alpha=alpha)


def test_floater_gradients_reach_mlp_and_p0():
    torch.manual_seed(3)
    emb = FloaterEmbedding(6, hidden=8, delta=0.5)
    x = torch.randn(2, 5, 6, requires_grad=True)
    pos = torch.tensor([[0, 1, 2, 3, 4], [3, 9, 2, 2, 7]])  # per-row, unsorted, repeated
    emb(x, pos).pow(2).sum().backward()
    grads = {name: p.grad for name, p in emb.named_parameters()}
    assert set(grads) == {"p0", "dynamics.net.0.weight", "dynamics.net.0.bias", "dynamics.net.2.weight",
                          "dynamics.net.2.bias"}
    for name, g in grads.items():
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name
    assert x.grad is not None


@pytest.mark.parametrize("method,tol", [("rk4", 0.0), ("dopri5", 1e-4)])
def test_floater_prefix_stable_and_consistent(method, tol):
    torch.manual_seed(4)
    emb = FloaterEmbedding(4, max_positions=8, hidden=8, delta=0.3, method=method)
    assert emb.max_positions is None and emb.train_positions == 8
    N = 8
    with torch.no_grad():
        short = emb.encode(torch.arange(N))
        long = emb.encode(torch.arange(4 * N))
        assert_close(long[:N], short, rtol=0, atol=tol, name="prefix")
        assert_close(short[0], emb.p0, rtol=0, atol=0, name="p(0) = p0")
        # forward with per-row positions picks the same vectors
        pos = torch.tensor([[5, 0, 3], [31, 2, 2]])
        out = emb(torch.zeros(2, 3, 4), pos)
        assert_close(out, long[pos], rtol=0, atol=max(tol, 1e-6), name="forward")
    assert not torch.allclose(short[1], short[0])  # the ODE does move


def test_floater_validation():
    with pytest.raises(ValueError, match="method"):
        FloaterEmbedding(4, method="euler4")
    with pytest.raises(ValueError, match="delta"):
        FloaterEmbedding(4, delta=0)


def test_complex_order_formula_and_gradients():
    torch.manual_seed(5)
    dim, vocab = 8, 11
    emb = ComplexOrderEmbedding(dim, vocab)
    x = torch.randn(2, 4, dim, requires_grad=True)
    ids = torch.randint(0, vocab, (2, 4))
    pos = torch.tensor([[0, 1, 2, 3], [100, 2000, 7, 8]])
    out = emb(x, pos, input_ids=ids)
    # by hand: r_w e^{i (omega_w p + theta_w)} with Re and Im parts concatenated
    r = x.detach().double()[..., : dim // 2]
    phi = emb.omega.detach().double()[ids] * pos.double()[..., None] + emb.theta.detach().double()[ids]
    f = r * torch.exp(1j * phi)
    assert_close(out, torch.cat((f.real, f.imag), dim=-1), rtol=1e-5, atol=1e-6, name="complex order")
    out.pow(2).mul(torch.randn_like(out)).sum().backward()
    for name in ("omega", "theta"):
        g = getattr(emb, name).grad
        assert g is not None and g[ids.unique()].abs().sum() > 0, name
        unused = torch.ones(vocab, dtype=torch.bool)
        unused[ids.unique()] = False
        assert g[unused].abs().sum() == 0  # only the words present get gradient
    assert x.grad is not None and x.grad[..., : dim // 2].abs().sum() > 0


def test_complex_order_validation():
    emb = ComplexOrderEmbedding(4, 5)
    with pytest.raises(ValueError, match="input_ids"):
        emb(torch.zeros(1, 3, 4), torch.arange(3))
    with pytest.raises(ValueError, match="input_ids"):
        emb(torch.zeros(1, 3, 4), torch.arange(3), input_ids=torch.tensor([[0, 1, 5]]))
    with pytest.raises(ValueError, match="dim"):
        ComplexOrderEmbedding(5, 5)


def _expected_embedding(name, emb, x, pos, ids):
    """What each registered embedding adds to (or makes of) ``x [B, N, 8]`` at positions ``pos [N]``, one
    scalar at a time from the formulas (the learned tables read as they are)."""
    B, N, dim = x.shape
    out = x.clone().double()
    for b in range(B):
        for t in range(N):
            p = int(pos[t])
            if name == "sinusoidal":  # PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(...)
                for i in range(dim // 2):
                    w = emb.base ** (-2 * i / dim)
                    out[b, t, 2 * i] += math.sin(p * w)
                    out[b, t, 2 * i + 1] += math.cos(p * w)
            elif name == "learned":
                out[b, t] += emb.table[p].double()
            elif name == "hierarchical":  # q_(i n + j) = a u_i + (1 - a) u_j, u_i = (p_i - a p_0) / (1 - a)
                n, a = emb.table_size, emb.alpha
                P = emb.table.double()
                u = [(P[r] - a * P[0]) / (1 - a) for r in range(n)]
                out[b, t] += P[p] if p < n else a * u[p // n] + (1 - a) * u[p % n]
            elif name == "complex_order":  # cat(r cos(omega_w p + theta_w), r sin(...)), r = x[:K]
                K = dim // 2
                for c in range(K):
                    phi = float(emb.omega[ids[b, t], c]) * p + float(emb.theta[ids[b, t], c])
                    out[b, t, c] = float(x[b, t, c]) * math.cos(phi)
                    out[b, t, K + c] = float(x[b, t, c]) * math.sin(phi)
    return out


@pytest.mark.parametrize("name,options", [("nope", {}), ("sinusoidal", {}), ("sinusoidal", {"base": 100.0}),
                                          ("learned", {}), ("hierarchical", {"alpha": 0.3}), ("complex_order", {})])
def test_registry_builds_each_embedding_with_its_options_and_values(name, options):
    torch.manual_seed(0)
    emb = build_embedding(name, dim=8, max_positions=4, vocab_size=13, **options)
    assert isinstance(emb, EMBEDDINGS[name])
    for k, v in options.items():
        assert getattr(emb, k) == v
    x = torch.randn(2, 5, 8)
    pos = torch.tensor([0, 1, 3, 6, 13]) if name in ("hierarchical", "nope") else torch.tensor([0, 1, 2, 3, 0])
    ids = torch.randint(0, 13, (2, 5))
    with torch.no_grad():
        got = emb(x, pos, input_ids=ids)
        expected = _expected_embedding(name, emb, x, pos, ids)
    assert_close(got, expected, rtol=1e-5, atol=1e-6, name=name)


def test_registry_builds_floater_as_an_ode_from_p0():
    """p(0) = p0; p(delta) = one RK4 step of dp/dt = h(t, p) from p0. torchdiffeq's ``rk4`` is Kutta's 3/8
    rule (the classical 1/6 rule differs by ~6e-7 here, beyond the tolerance)."""
    torch.manual_seed(0)
    emb = build_embedding("floater", dim=8, max_positions=4, vocab_size=13, delta=0.5)
    x = torch.zeros(1, 2, 8)
    with torch.no_grad():
        got = emb(x, torch.arange(2))
        h, dt, p0 = emb.dynamics, emb.delta, emb.p0
        k1 = h(torch.tensor(0.0), p0)
        k2 = h(torch.tensor(dt / 3), p0 + dt / 3 * k1)
        k3 = h(torch.tensor(2 * dt / 3), p0 + dt * (k2 - k1 / 3))
        k4 = h(torch.tensor(dt), p0 + dt * (k1 - k2 + k3))
        p1 = p0 + dt / 8 * (k1 + 3 * k2 + 3 * k3 + k4)
    assert_close(got[0, 0], p0, rtol=0, atol=0, name="p(0)")
    assert_close(got[0, 1], p1, rtol=1e-6, atol=1e-7, name="p(delta)")
    assert (p1 - p0).abs().max() > 1e-3  # the step moves: the check above is not p0 against p0


def test_registry_and_build_errors():
    assert set(EMBEDDINGS) == {"nope", "sinusoidal", "learned", "hierarchical", "floater", "complex_order"}
    assert build_embedding("hierarchical", dim=8, max_positions=16).max_positions == 256
    with pytest.raises(ValueError, match="embedding"):
        build_embedding("rotary", dim=8)
    with pytest.raises(ValueError, match="option"):
        build_embedding("learned", dim=8, max_positions=4, alpha=0.3)
    with pytest.raises(ValueError, match="max_positions"):
        build_embedding("learned", dim=8)


def test_input_validation():
    emb = SinusoidalEmbedding(8)
    with pytest.raises(ValueError, match="dim"):
        SinusoidalEmbedding(7)
    with pytest.raises(ValueError, match="width"):
        emb(torch.zeros(1, 3, 6), torch.arange(3))
    with pytest.raises(ValueError, match="positions"):
        emb(torch.zeros(1, 3, 8), torch.arange(4))
    with pytest.raises(ValueError, match="positions"):
        emb(torch.zeros(1, 3, 8), torch.tensor([0, -1, 2]))
    with pytest.raises(ValueError, match="max_positions"):
        LearnedEmbedding(8, 0)
