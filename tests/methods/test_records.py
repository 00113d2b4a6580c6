"""posenc.methods.records: a parameter's range message reads as a sentence."""

from __future__ import annotations

import math

import pytest

from posenc import PositionScheme

P = PositionScheme


@pytest.mark.parametrize("name, params, message", [
    ("fire", {"threshold": 0}, "fire.threshold must be a number >= 1, got 0"),
    ("fire", {"c": 0.0}, "fire.c must be a number > 0, got 0.0"),
    ("fox", {"bias_init": "x"}, "fox.bias_init must be a finite number, got 'x'"),
    ("fox", {"bias_init": math.inf}, "fox.bias_init must be a finite number, got inf"),
    ("cope", {"npos_max": 1.5}, "cope.npos_max must be an integer >= 2, got 1.5"),
    # refused when the scheme is built (they were a raw TypeError, accepted until a model was built, or 0 replaced
    # by the default)
    ("streaming_llm", {"n_sinks": "x"}, "streaming_llm.n_sinks must be an integer >= 0, got 'x'"),
    ("hierarchical", {"alpha": 1.0}, "hierarchical.alpha must be > 0 and < 1, got 1.0"),
    ("hierarchical", {"alpha": "x"}, "hierarchical.alpha must be > 0 and < 1, got 'x'"),
    ("learned", {"max_positions": 0}, "learned.max_positions must be an integer >= 1, got 0"),
    ("infini", {"segment_len": 0}, "infini.segment_len must be an integer >= 1, got 0"),
    ("infini", {"segment_len": "x"}, "infini.segment_len must be an integer >= 1, got 'x'"),
    ("infini", {"rope": "no"}, "infini.rope must be true or false, got 'no'"),
])
def test_range_messages_read_as_a_sentence(name, params, message):
    with pytest.raises(ValueError) as exc:
        P.preset(name, train_len=64, **params)
    assert str(exc.value) == message
