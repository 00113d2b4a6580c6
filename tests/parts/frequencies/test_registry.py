"""posenc.parts.frequencies.registry: every HF rope type is implemented and tested; each rope_type declares its own
effective factor (``factor(params, seq_len)``, filed by the registration decorator beside the schedule), and
``scaling_factor`` reads it. The table below was computed with the former ``scaling_factor``, which chose the
factor by comparing rope_type names; the declared factors give the same values and refuse the same inputs with
the same messages."""

from __future__ import annotations

import math
import re

import pytest
import torch

from posenc.parts.frequencies import ROPE_SCALINGS, is_dynamic, rope_frequencies, scaling_factor
from posenc.parts.frequencies.registry import DYNAMIC, FACTORS, KEYS, register

transformers = pytest.importorskip("transformers")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

transformers.logging.set_verbosity_error()  # HF warns about the configs we deliberately stretch


# ----------------------------------------------------------------------------------------------------------
# tier 1: equality with Hugging Face

HF_TESTED = {"default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"}


def test_every_hf_rope_type_is_implemented_and_tested():
    hf_types = set(ROPE_INIT_FUNCTIONS) | {"default"}
    assert hf_types <= set(ROPE_SCALINGS), hf_types - set(ROPE_SCALINGS)
    assert hf_types <= HF_TESTED, f"new HF rope types without an equality test: {hf_types - HF_TESTED}"

L = {"original_max_position_embeddings": 100}

BOTH = {"original_max_position_embeddings": 4096, "max_position_embeddings": 16384}

NEEDS_FACTOR = "scaling['factor'] is required for rope_type {!r} (a finite number >= 1)"

NEEDS_LEN = ("scaling['original_max_position_embeddings'] (an integer >= 1, the trained length) "
             "is required for rope_type {!r}")

NEEDS_SEQ = "seq_len is required for rope_type {!r} (its frequencies depend on the sequence length)"


# (scaling, seq_len, expected factor or the start of the ValueError's message)
TABLE = [
    (None, None, 1.0), ({}, None, 1.0), ({"rope_type": "default"}, None, 1.0), ({"rope_type": "default"}, 5000, 1.0),
    ({"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}, None, 1.0),
    ({"rope_type": "base", "base": 1e6}, None, 1.0), ({"rope_type": "base", "rope_theta": 500.0}, 9000, 1.0),
    ({"rope_type": "base"}, None, 1.0),  # the schedule refuses it; its factor is 1 all the same
    ({"rope_type": "linear", "factor": 3.0}, None, 3.0), ({"type": "linear", "factor": 2}, 7, 2.0),
    ({"rope_type": "linear"}, None, NEEDS_FACTOR.format("linear")),
    ({"rope_type": "ntk", "factor": 4.0}, None, 4.0), ({"rope_type": "ntk", "alpha": 5.0}, None, 5.0),
    ({"rope_type": "ntk", "alpha": 5.0, "factor": 2.0}, None, 5.0),  # alpha first (the schedule refuses both)
    ({"rope_type": "ntk"}, None, NEEDS_FACTOR.format("ntk")),
    ({"rope_type": "ntk_mixed", "factor": 8.0, "b": 0.5}, None, 8.0),
    ({"rope_type": "ntk_mixed"}, None, NEEDS_FACTOR.format("ntk_mixed")),
    ({"rope_type": "dynamic", "factor": 2.0, **L}, 150, 2.0), ({"rope_type": "dynamic", "factor": 2.0, **L}, 100, 1.0),
    ({"rope_type": "dynamic", "factor": 2.0, **L}, 101, 1.02),
    ({"rope_type": "dynamic", "factor": 4.0, **L}, 1000, 37.0),
    ({"rope_type": "dynamic", "factor": 3.0, "max_position_embeddings": 64}, 100, 2.6875),
    ({"rope_type": "dynamic", "factor": 2.0, **L}, None, NEEDS_SEQ.format("dynamic")),
    ({"rope_type": "dynamic", **L}, 50, 1.0),  # inside L the factor is not read
    ({"rope_type": "dynamic", **L}, 150, NEEDS_FACTOR.format("dynamic")),
    ({"rope_type": "dynamic", "factor": 2.0}, 150, NEEDS_LEN.format("dynamic")),
    ({"rope_type": "dynamic", "factor": 2.0, **L}, torch.tensor(300), 5.0),
    ({"rope_type": "dynamic_qwen", **L}, 201, 7.0), ({"rope_type": "dynamic_qwen", **L}, 100, 1.0),
    ({"rope_type": "dynamic_qwen", **L}, 101, 3.0), ({"rope_type": "dynamic_qwen", **L}, 200, 3.0),
    ({"rope_type": "dynamic_qwen", **L}, 401, 15.0), ({"rope_type": "dynamic_qwen", **L}, 3200, 63.0),
    ({"rope_type": "dynamic_qwen", **L}, None, NEEDS_SEQ.format("dynamic_qwen")),
    ({"rope_type": "dynamic_qwen"}, 10, NEEDS_LEN.format("dynamic_qwen")),
    ({"rope_type": "dynamic_yarn", **L}, 250, 2.5), ({"rope_type": "dynamic_yarn", **L}, 100, 1.0),
    ({"rope_type": "dynamic_yarn", **L}, 1, 1.0), ({"rope_type": "dynamic_yarn", "beta_fast": 16, **L}, 333, 3.33),
    ({"rope_type": "dynamic_yarn", **L}, None, NEEDS_SEQ.format("dynamic_yarn")),
    ({"rope_type": "dynamic_yarn"}, 5, NEEDS_LEN.format("dynamic_yarn")),
    ({"rope_type": "yarn", "factor": 4.0, **L}, None, 4.0), ({"rope_type": "yarn", "factor": 4.0}, None, 4.0),
    ({"rope_type": "yarn", **BOTH}, None, 4.0), ({"rope_type": "yarn", "factor": 2.0, **BOTH}, 99999, 2.0),
    ({"rope_type": "yarn", **L}, None, NEEDS_FACTOR.format("yarn")),
    ({"rope_type": "yarn"}, None, NEEDS_FACTOR.format("yarn")),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, None, 8.0),
    ({"rope_type": "llama3", "factor": 8.0}, None, 8.0),
    ({"rope_type": "llama3", **L}, None, NEEDS_FACTOR.format("llama3")),
    ({"rope_type": "longrope", "factor": 4.0, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4, **L}, None, 4.0),
    ({"rope_type": "longrope", "factor": 4.0, **L}, 50, 4.0),  # longrope's factor does not depend on seq_len
    ({"rope_type": "longrope", **BOTH}, 99999, 4.0),
    ({"rope_type": "longrope", "attention_factor": 1.2, **L}, None, NEEDS_FACTOR.format("longrope")),
    ({"rope_type": "longrope"}, 1000, NEEDS_FACTOR.format("longrope")),
    ({"rope_type": "proportional", "factor": 2.0}, None, 2.0), ({"rope_type": "proportional"}, None, 1.0),
    ({"rope_type": "proportional", "partial_rotary_factor": 0.25}, 100, 1.0),
    ({"rope_type": "linear", "factor": 3.0}, 0, "seq_len must be an integer >= 1, got 0"),
    ({"rope_type": "default"}, -1, "seq_len must be an integer >= 1, got -1"),
    ({"rope_type": "nope"}, None, "scaling['rope_type'] must be one of ['base', 'default', 'dynamic', "),
    ({"rope_type": "linear", "factor": 0.5}, None, "scaling['factor'] must be >= 1.0, got 0.5"),
    ({"rope_type": "linear", "factor": 2.0, "alpha": 2.0}, None,
     "scaling has keys ['alpha'] that rope_type 'linear' does not use"),
    ({"rope_type": "ntk", "factor": 2.0, "resonance": True}, None, 2.0),
    ({"rope_type": "dynamic", "factor": 2.0, "resonance": True, **L}, 400, 7.0),
]


@pytest.mark.parametrize("scaling, seq_len, expected", TABLE, ids=[str(i) for i in range(len(TABLE))])
def test_scaling_factor_matches_the_table(scaling, seq_len, expected):
    if isinstance(expected, str):
        with pytest.raises(ValueError, match="^" + re.escape(expected)):
            scaling_factor(scaling, seq_len)
    else:
        out = scaling_factor(scaling, seq_len)
        assert isinstance(out, float) and out == expected


def test_the_table_reaches_every_rope_type():
    named = {(s or {}).get("rope_type", (s or {}).get("type", "default")) for s, _, _ in TABLE}
    assert set(ROPE_SCALINGS) <= named


def test_every_rope_type_declares_its_factor():
    assert set(FACTORS) == set(ROPE_SCALINGS) == set(KEYS)
    assert DYNAMIC <= set(ROPE_SCALINGS)
    assert all(callable(f) for f in FACTORS.values())


@pytest.fixture
def toy_rope_type():
    """A rope_type registered for one test, then removed from every registry table."""
    name = "toy_test_schedule"
    yield name
    for table in (ROPE_SCALINGS, FACTORS, KEYS):
        table.pop(name, None)
    DYNAMIC.discard(name)


def test_scaling_factor_reads_the_declared_factor(toy_rope_type):
    """A rope_type the package has never heard of gets its factor from its own declaration alone."""
    seen = []

    def toy_factor(params, seq_len):
        seen.append((params, seq_len))
        return 2.0 * params["factor"] + (seq_len or 0)

    @register(toy_rope_type, ("factor",), dynamic=True, factor=toy_factor)
    def toy(head_dim, dim, base, params, seq_len):
        raise AssertionError("scaling_factor must not compute frequencies")

    assert scaling_factor({"rope_type": toy_rope_type, "factor": 3.0}, torch.tensor(5)) == 11.0
    assert seen == [({"rope_type": toy_rope_type, "factor": 3.0}, 5)]  # params validated, seq_len an int
    assert scaling_factor({"rope_type": toy_rope_type, "factor": 1.5}) == 3.0
    assert is_dynamic({"rope_type": toy_rope_type, "factor": 1.5})


@pytest.mark.parametrize("rope_type, scaling", [
    ("linear", {"factor": 4.0}), ("proportional", {"factor": 2.0}),
])
def test_declared_factor_is_the_one_the_frequencies_divide_by(rope_type, scaling):
    """For the schedules that divide the whole ladder, the declared factor is the divisor."""
    scaling = {"rope_type": rope_type, **scaling}
    default = rope_frequencies(64, 10000.0).inv_freq.double()
    out = rope_frequencies(64, 10000.0, scaling).inv_freq.double()
    torch.testing.assert_close(out, default / scaling_factor(scaling), rtol=1e-6, atol=0)


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic_yarn"])
def test_yarn_attention_scale_follows_the_declared_factor(rope_type):
    """YaRN's scale is ``0.1 ln s + 1`` of the very factor its declaration reports."""
    scaling = {"rope_type": rope_type, **BOTH}
    for seq_len in (4096, 8192, 30000):
        s = scaling_factor(scaling, seq_len)
        scale = rope_frequencies(64, 10000.0, scaling, seq_len=seq_len).attention_scale
        assert scale == pytest.approx(1.0 if s <= 1 else 0.1 * math.log(s) + 1.0, rel=1e-12)
