"""``calls``: counts calls of the Toeplitz kernel, so a test knows the Toeplitz path really ran."""

import pytest

import posenc.engine.toeplitz as toeplitz_mod


@pytest.fixture
def calls(monkeypatch):
    """Counts calls of the Toeplitz kernel (so a test knows the path really ran)."""
    n = {"calls": 0}
    real = toeplitz_mod.toeplitz_attention

    def spy(*a, **kw):
        n["calls"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(toeplitz_mod, "toeplitz_attention", spy)
    return n
