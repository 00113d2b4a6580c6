"""The real model's tokenizer (SmolLM2's BPE) and the book and noise haystacks it cuts, shared by the task
generator, context and haystack tests."""

import pytest

from posenc.tasks.haystack import make_haystack


@pytest.fixture(scope="module")
def tok():
    from posenc.hf.source import load_tokenizer

    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def hay(tok):
    return {name: make_haystack(name, tok) for name in ("book", "noise")}
