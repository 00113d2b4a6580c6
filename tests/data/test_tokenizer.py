"""posenc.data.tokenizer: the byte and BPE tokenizers, the token dtype, and bad names and options."""

from __future__ import annotations

import json

import numpy as np
import pytest

from posenc.data import tokenizer as T

# ----------------------------------------------------------------------------------------- tokenizers


def test_byte_tokenizer_roundtrip():
    tok = T.make_tokenizer("byte")
    text = "Hamlet — «to be» 生存还是毁灭 🙂\n"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == text
    assert tok.vocab_size == 257 and tok.bos_id == 256 and tok.decode([256, *ids]) == text
    assert T.ByteTokenizer(bos=False).vocab_size == 256
    assert tok.decode(tok.encode("ab") + [0xE2]) == "ab\ufffd"  # broken UTF-8 -> replacement char
    assert T.token_dtype(256) == np.uint8 and T.token_dtype(257) == np.uint16
    assert T.token_dtype(70000) == np.int32
    with pytest.raises(ValueError, match="tokenizer"):
        T.make_tokenizer("nope")


def test_bpe_trains_and_roundtrips(tmp_path):
    texts = ["To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"] * 20
    tok = T.make_tokenizer("bpe", texts=texts, vocab_size=300, min_frequency=1)
    assert 258 <= tok.vocab_size <= 300
    sample = "To be or not to be — ça va? 🙂"
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample
    assert len(tok.encode(texts[0])) < len(texts[0]) / 2  # merges were learned
    tok.save(tmp_path / "tok.json")
    json.loads((tmp_path / "tok.json").read_text())
    loaded = T.make_tokenizer("bpe", path=tmp_path / "tok.json")
    assert loaded.encode(sample) == ids and loaded.bos_id == tok.bos_id == 0


@pytest.mark.parametrize("name, options, match", [
    ("bytes", {}, r"tokenizer must be one of \['bpe', 'byte'\], got 'bytes'"),
    (None, {}, r"tokenizer must be one of"),
    ("byte", {"bogus": 1}, r"tokenizer 'byte' does not take options \['bogus'\]"),
])
def test_make_tokenizer_refuses_bad_names_and_options(name, options, match):
    from posenc.data.tokenizer import make_tokenizer

    with pytest.raises(ValueError, match=match):
        make_tokenizer(name, **options)
