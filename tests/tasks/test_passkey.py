"""Tests for posenc.tasks.passkey: passkey prompts (exact length, depth, answer) and scoring."""

from __future__ import annotations

import pytest
import torch

from posenc.data.tokenizer import BPETokenizer, ByteTokenizer
from posenc.tasks import passkey as T

TOK = ByteTokenizer()


@pytest.mark.parametrize("length", [260, 513, 2048])
@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_prompt_exact_length_and_answer(length, depth):
    prompt, answer = T.make_passkey_prompt(length, depth, 48213, TOK)
    assert len(prompt) == length
    assert TOK.decode(answer) == "48213"
    text = TOK.decode(prompt)
    assert prompt[0] == TOK.bos_id
    assert text.startswith(T.PASSKEY_INSTRUCTION) and text.endswith("What is the pass key? The pass key is ")
    assert "The pass key is 48213. Remember it. 48213 is the pass key." in text


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_key_at_requested_depth(depth):
    length = 4000
    prompt, _ = T.make_passkey_prompt(length, depth, "12345", TOK, instruction=None, bos=False)
    text = TOK.decode(prompt)  # byte tokenizer on ASCII: character offset == token offset
    key_at = text.index("\nThe pass key is 12345")
    n_fill = length - len("\nThe pass key is 12345. Remember it. 12345 is the pass key.\n") - len(
        "\n" + T.PASSKEY_QUESTION)
    assert abs(key_at / n_fill - depth) < 0.01  # a filler sentence is ~20 of ~3900 tokens
    assert text[:key_at].endswith(". ") or key_at == 0 or key_at == n_fill  # inserted at a sentence border


def test_prompt_with_bpe_has_exact_length():
    tok = BPETokenizer.train([T.PASSKEY_FILLER * 20, T.PASSKEY_INSTRUCTION, T.PASSKEY_QUESTION],
                             vocab_size=300, min_frequency=1)
    for length in (250, 333, 1000):
        prompt, answer = T.make_passkey_prompt(length, 0.5, 90817, tok)
        assert len(prompt) == length and tok.decode(answer) == "90817"
        assert "90817 is the pass key" in tok.decode(prompt)


def test_prompt_validation():
    with pytest.raises(ValueError, match="length_tokens"):
        T.make_passkey_prompt(50, 0.5, 12345, TOK)
    with pytest.raises(ValueError, match="depth"):
        T.make_passkey_prompt(500, 1.5, 12345, TOK)
    with pytest.raises(ValueError, match="passkey"):
        T.make_passkey_prompt(500, 0.5, "12a45", TOK)


def test_filler_seed_and_custom_filler():
    a, _ = T.make_passkey_prompt(600, 0.5, 11111, TOK, seed=0)
    b, _ = T.make_passkey_prompt(600, 0.5, 11111, TOK, seed=1)
    assert a != b and len(a) == len(b) == 600
    c, _ = T.make_passkey_prompt(600, 0.5, 11111, TOK, filler="Lorem ipsum dolor. Sit amet.")
    assert "Lorem ipsum dolor. Sit amet. Lorem" in TOK.decode(c)


def test_grid_enumerates_and_is_stable():
    grid = T.passkey_grid([300, 600], [0.0, 0.5, 1.0], 2, TOK, seed=7)
    assert len(grid) == 12
    assert [(p.length, p.depth, p.trial) for p in grid[:3]] == [(300, 0.0, 0), (300, 0.0, 1), (300, 0.5, 0)]
    assert all(len(p.prompt) == p.length and len(p.passkey) == 5 for p in grid)
    assert len({p.passkey for p in grid}) > 6
    again = T.passkey_grid([600], [0.5], 2, TOK, seed=7)
    assert [p.prompt for p in again] == [p.prompt for p in grid if p.length == 600 and p.depth == 0.5]


def _oracle(full: list[int], vocab: int = 257, wrong_at: int | None = None):
    """Logits with a huge value on the true next token of ``full`` (optionally wrong at one index)."""

    def fn(ids):
        n = ids.shape[1]
        assert ids[0].tolist() == full[:n]
        logits = torch.zeros(1, n, vocab)
        for i in range(n):
            nxt = full[i + 1]
            logits[0, i, (nxt + 1) % vocab if i == wrong_at else nxt] = 50.0
        return logits

    return fn


def test_score_passkey_oracle_constant_and_partial():
    prompt, answer = T.make_passkey_prompt(400, 0.5, 31415, TOK)
    full = prompt + answer
    right = T.score_passkey(_oracle(full), prompt, answer)
    assert right["exact"] == 1.0 and right["digit_accuracy"] == 1.0 and right["predicted"] == answer
    const = T.score_passkey(lambda ids: torch.zeros(1, ids.shape[1], 257), prompt, answer)
    assert const["exact"] == 0.0 and const["digit_accuracy"] == 0.0
    one_off = T.score_passkey(_oracle(full, wrong_at=len(prompt) + 1), prompt, answer)
    assert one_off["exact"] == 0.0 and one_off["digit_accuracy"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="logits_fn"):
        T.score_passkey(lambda ids: torch.zeros(1, 3, 257), prompt, answer)


def test_run_passkey_aggregates():
    grid = T.passkey_grid([300], [0.0, 1.0], 3, TOK)

    def fn(ids):  # knows every prompt's full sequence: right on depth 0, constant on depth 1
        for p in grid:
            full = p.prompt + p.answer
            if ids[0].tolist() == full[: ids.shape[1]] and p.depth == 0.0:
                return _oracle(full)(ids)
        return torch.zeros(1, ids.shape[1], 257)

    out = T.run_passkey(fn, grid)
    assert len(out["trials"]) == 6
    assert [(c["depth"], c["accuracy"], c["n"]) for c in out["cells"]] == [(0.0, 1.0, 3), (1.0, 0.0, 3)]
