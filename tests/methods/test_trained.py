"""posenc.methods.trained: the trained-in methods with new parts (CoPE, FoX, FIRE; with p-RoPE): complete records
that build their part, presets that train, every backend equal to ``reference`` (flex with padding, compiled flex
running the data and learned biases), cached decoding equal to the full forward."""

from __future__ import annotations

import pytest
import torch

from posenc import PositionalAttention, PositionScheme
from posenc._util import relative_error
from posenc.engine import make_call
from posenc.methods import TRAINED_METHODS
from posenc.models.cache import KVCache
from posenc.models.generation import left_padded_positions
from posenc.scheme.core import TRAINED
from tests.support.tiny_lm import _model, _randomize_, _scheme

NEW = ("p_rope", "cope", "fox", "fire")


# ============================================================================ every backend
def _backends_vs_reference(name, impls, n, seed=4, padded=(False, True)):
    torch.manual_seed(seed)
    m = _randomize_(PositionalAttention(32, 4, _scheme(name)).eval())
    x = torch.randn(2, n, 32)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, :37] = False
    with torch.no_grad():
        for key_mask in [mask if p else None for p in padded]:
            ref = m(x, impl="reference", key_mask=key_mask)
            for impl in impls:
                err = relative_error(m(x, impl=impl, key_mask=key_mask), ref)
                assert err <= 1e-5, (name, impl, key_mask is not None, err)


@pytest.mark.parametrize("name", NEW)
def test_every_backend_equals_reference(name):
    """blockwise, sdpa, toeplitz/band/sinks (their fallbacks where they cannot run it) and auto equal the
    reference at a length with two blockwise tiles (auto: past the size where it leaves the reference),
    with and without padding keys. (Compiled flex: below, and every preset in tests/engine/backends/test_flex.py.)"""
    _backends_vs_reference(name, ("blockwise", "sdpa", "toeplitz", "band", "sinks", "auto"), 300)


@pytest.mark.compile
@pytest.mark.parametrize("name", ["cope", "fox"])
def test_flex_equals_reference_with_padding(name):
    """impl="flex" with padding keys (without: every preset in tests/engine/backends/test_flex.py): FoX's
    gates as a score_mod, padded to whole blocks with the keys; CoPE takes the documented blockwise fallback."""
    _backends_vs_reference(name, ("flex",), 130, padded=(True,))


@pytest.mark.parametrize("name", ["fox", "fire"])
def test_compiled_flex_runs_the_data_and_learned_biases(name):
    """FoX's gates and FIRE's MLP are score_mods: at inference flex runs them itself (no fallback)."""
    from posenc.engine import choose_backend

    m = _randomize_(PositionalAttention(32, 4, _scheme(name)))
    x = torch.randn(1, 20, 32)
    q, k, v = m.project(x)
    gates = None
    if name == "fox":
        c = m.gate(x).cumsum(-1).detach()
        gates = (c, c)
    with torch.no_grad():
        backend, declined = choose_backend(make_call(m.parts, q, k, v, gates=gates), "flex")
    assert backend.name == "flex", declined


# ============================================================================ cached decoding


def _full_and_decoded(model, prefill=12, total=40, short=31):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, total), generator=g)
    mask = torch.ones(2, total, dtype=torch.long)
    mask[1, :total - short] = 0
    pos = left_padded_positions(mask)
    with torch.no_grad():
        full = model(ids, positions=pos, attention_mask=mask)
        cache = KVCache.for_model(model, 2)
        outs = [model(ids[:, :prefill], positions=pos[:, :prefill], cache=cache, attention_mask=mask[:, :prefill])]
        outs += [model(ids[:, t:t + 1], cache=cache) for t in range(prefill, total)]
    return full[mask.bool()], torch.cat(outs, dim=1)[mask.bool()], cache


@pytest.mark.parametrize("name", NEW)
def test_decode_equals_full_forward(name):
    full, dec, _ = _full_and_decoded(_model(_scheme(name)))
    assert relative_error(dec, full) <= 1e-5, name


# ============================================================================ records, presets, CLI
@pytest.mark.parametrize("name", sorted(TRAINED_METHODS))
def test_trained_records_are_complete_and_build_their_part(name):
    m = TRAINED_METHODS[name]
    assert m.paper.startswith("arXiv:") and m.description.strip() and m.apply is not None
    assert name in TRAINED and TRAINED[name][1] == m.description
    s = PositionScheme.preset(name, train_len=32)
    assert s.name == name and getattr(s, m.sets[0]).kind == name
    assert PositionScheme.from_json(s.to_json()) == s
    for p in m.params:
        assert p.default is not None or p.rule
        assert p.contains(p.default_for(32))


def test_trained_presets_train():
    """One optimizer step moves every learned positional parameter (gradients reach them)."""
    for name in ("cope", "fox", "fire"):
        model = _model(_scheme(name)).train()
        ids = torch.randint(0, 64, (2, 16))
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        own = [(n, p) for n, p in model.named_parameters() if ".gate." in n or ".relative." in n or ".bias." in n]
        assert own and all(p.grad is not None and float(p.grad.abs().max()) > 0 for _, p in own), name
