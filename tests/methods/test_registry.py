"""The method registry (posenc/methods/registry.py): complete records, every method builds, the one ``"a+b"``
parser, per-length defaults, every method equal to plain RoPE at its limit, HF rope types, and no method-name
comparisons outside the registries."""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import posenc
from posenc import attention
from posenc._util import assert_close
from posenc.methods import (
    HF_ONLY,
    METHODS,
    NONE,
    UnknownMethodError,
    hf_methods,
    is_identity,
    length_defaults,
    lookup,
    parse_methods,
)
from posenc.parts.absolute import build_embedding
from posenc.parts.frequencies import ROPE_SCALINGS
from posenc.parts.remap import REMAPS
from posenc.scheme.core import PositionScheme
from tests.support.attention import _qkv

torch.manual_seed(0)


# ------------------------------------------------------------------ limits that reduce to known cases
@pytest.mark.parametrize("method,params", [
    ("rerope", {"window": 100}),            # window >= length
    ("leaky_rerope", {"window": 8, "factor": 1.0}),  # k = 1
    ("selfextend", {"group": 1, "window": 8}),       # G = 1
    ("lm_infinite", {"window": 100, "ceiling": 100}),
    ("sliding_window", {"window": 100}),
    ("streaming_llm", {"window": 100, "n_sinks": 4}),
    ("dynamic_ntk", {}),                    # inside the trained length
    ("dynamic_yarn", {}),
    ("dynamic_ntk_qwen", {}),
    ("logn", {}),
])
def test_limits_equal_plain_rope(method, params):
    q, k, v = _qkv(N=64)
    plain = attention(q, k, v, PositionScheme.preset("rope", train_len=64), impl="reference")
    s = PositionScheme.preset(method, train_len=64, **params)
    for impl in ("reference", "blockwise"):
        assert_close(attention(q, k, v, s, impl=impl), plain, rtol=1e-5, atol=1e-6, name=f"{method}/{impl}")


@pytest.mark.parametrize("train_len,eval_len", [(32, 32), (32, 64), (128, 1000), (128, 4096)])
def test_length_defaults_keep_positions_in_range(train_len, eval_len):
    ratio = max(1.0, eval_len / train_len)
    for m in ("pi", "ntk", "ntk_mixed", "yarn", "llama3"):
        assert length_defaults(m, train_len, eval_len) == {"factor": ratio}
    assert length_defaults("rerope", train_len, eval_len) == {"window": train_len // 2}
    lk = length_defaults("leaky_rerope", train_len, eval_len)
    w, k = lk["window"], lk["factor"]
    assert w == train_len // 4 and k >= 1 and float(w * (k - 1)).is_integer()
    assert w + (eval_len - 1 - w) / k <= train_len - 1
    assert k == 1 or w + (eval_len - 1 - w) / (k - 1 / w) > train_len - 1  # smallest such factor
    se = length_defaults("selfextend", train_len, eval_len)
    g, w = se["group"], se["window"]
    assert (eval_len - 1) // g + w - w // g <= train_len - 1
    base = length_defaults("rope_base", train_len, eval_len, head_dim=16)["base"]
    assert base == pytest.approx(10000 * ratio ** (16 / 14))
    assert length_defaults("bca", train_len, eval_len) == {"block": train_len // 2}
    assert length_defaults("streaming_llm", train_len, eval_len)["window"] + 4 == train_len
    merged = length_defaults("yarn+selfextend", train_len, eval_len)
    assert merged == {"factor": ratio, **se}
    assert length_defaults("dynamic_ntk", train_len, eval_len) == {}

PAPER = re.compile(r"^(arXiv:\d{4}\.\d{4,5}|https://\S+)$")

KINDS = {"frequencies", "base", "remap", "scale", "mask", "embedding"}

SETS = {"rope.scaling", "rope.base", "remap", "logn", "mask", "embedding", "temperature"}

L = 64


def _required(m) -> dict:
    return {p.name: 2.0 for p in m.params if p.required}


def _build(m, **params):
    return PositionScheme.preset(m.base_preset, train_len=L).extend(m.name, **{**_required(m), **params})


@pytest.mark.parametrize("name", sorted(METHODS) + sorted(HF_ONLY))
def test_every_record_is_complete(name):
    m = METHODS.get(name) or HF_ONLY[name]
    assert m.name == name and m.kind in KINDS and set(m.sets) <= SETS and m.sets
    assert m.description.strip() and PAPER.match(m.paper), (m.description, m.paper)
    assert len(set(m.param_names)) == len(m.params)
    for p in m.params:
        assert p.default is not None or p.rule, f"{name}.{p.name} has neither a default nor a rule"
        if p.default is not None:
            assert p.contains(p.default), f"{name}.{p.name} default {p.default} outside its range"
        if p.from_train_len is not None:
            assert p.contains(p.from_train_len(L)), f"{name}.{p.name} default at train_len {L} outside its range"
    if m.scaling_type is not None:
        assert m.scaling_type in ROPE_SCALINGS
    if m.remap_kind is not None:
        assert m.remap_kind in REMAPS


def _changed(a: PositionScheme, b: PositionScheme) -> set[str]:
    out = {f.name for f in fields(a) if f.name not in ("name", "rope") and getattr(a, f.name) != getattr(b, f.name)}
    if a.rope != b.rope:
        out |= {f"rope.{f.name}" for f in fields(a.rope) if getattr(a.rope, f.name) != getattr(b.rope, f.name)}
    return out


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_builds_and_sets_what_its_record_says(name):
    m = METHODS[name]
    base = PositionScheme.preset(m.base_preset, train_len=L)
    s = _build(m)
    assert _changed(base, s) == set(m.sets)
    assert s.is_dynamic == m.dynamic
    assert PositionScheme.presets()[name] == m.description


@pytest.mark.parametrize("name", sorted(METHODS))
def test_filled_defaults_are_what_the_scheme_gets(name):
    m = METHODS[name]
    s = _build(m)
    filled = m.filled_defaults(L)
    if m.scaling_type is not None:
        assert {k: s.rope.scaling[k] for k in filled} == filled
    elif m.remap_kind is not None and m.sets == ("remap",):
        assert dict(s.remap.params) == filled


# parameters whose range the parts check only when the model is built (not at extend)
_LATE = {("hierarchical", "alpha")}


@pytest.mark.parametrize("name, param", [(n, p.name) for n, m in sorted(METHODS.items()) for p in m.params
                                         if p.minimum is not None])
def test_documented_minimum_is_the_validated_one(name, param):
    m = METHODS[name]
    p = m.param(param)
    below = p.minimum - 1 if p.integer else (p.minimum if p.strict else p.minimum - 0.5)
    with pytest.raises(ValueError):
        s = _build(m, **{param: below})
        if (name, param) in _LATE:
            build_embedding(s.embedding.kind, dim=16, vocab_size=8, **s.embedding.params)
    inside = p.minimum + 1 if p.integer or p.strict else p.minimum
    if p.from_train_len is None and p.default is not None:
        inside = p.default
    try:
        _build(m, **{param: inside})
    except ValueError as exc:  # only a cross-parameter rule may refuse a value inside the range
        assert re.search(r"must be >|disagree|not both|beta_fast", str(exc)), exc


# ===================================================================== parsing
def test_parse_methods_round_trips():
    names = sorted(METHODS)
    for a, b in itertools.islice(itertools.permutations(names, 2), 0, None, 7):
        assert tuple(m.name for m in parse_methods(f"{a}+{b}")) == (a, b)
        assert tuple(m.name for m in parse_methods(f" {a} + {b} +")) == (a, b)
    assert parse_methods("none") == (NONE,) and parse_methods("default") == (NONE,)
    assert parse_methods("linear", hf=True) == (METHODS["pi"],)
    assert lookup("longrope", hf=True) is HF_ONLY["longrope"]


@pytest.mark.parametrize("spec, kw, unknown", [
    ("superrope", {}, "superrope"), ("yarn+superrope", {}, "superrope"), ("none", {"identity": False}, "none"),
    ("linear", {}, "linear"), ("longrope+logn", {}, "longrope"),
])
def test_parse_methods_rejects_unknown_names(spec, kw, unknown):
    with pytest.raises(UnknownMethodError) as err:
        parse_methods(spec, **kw)
    assert err.value.name == unknown
    assert f"unknown method {unknown!r}" in str(err.value) and "'yarn'" in str(err.value)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("spec, match", [(None, "preset name string"), (3, "preset name string"),
                                         ("", "non-empty"), ("+", "non-empty"), (" + ", "non-empty")])
def test_parse_methods_rejects_non_names(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_methods(spec)


def test_is_identity():
    assert all(is_identity(x) for x in (None, "", "none", "default", "none+default"))
    assert not any(is_identity(x) for x in ("yarn", "none+yarn", "bogus", 3))


# ===================================================================== Hugging Face
def test_hf_rope_types_are_transformers_ones():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    typed = {n: m.hf_rope_type for n, m in hf_methods().items() if m.hf_rope_type}
    assert typed and set(typed.values()) <= set(ROPE_INIT_FUNCTIONS), typed
    assert all(m.hf_rope_type for m in hf_methods().values() if m.hf_native)
    from posenc.hf.patch import HF_NATIVE

    assert HF_NATIVE == {"pi": "linear", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn",
                         "llama3": "llama3", "longrope": "longrope"}


# ===================================================================== no name comparisons elsewhere
PACKAGE = Path(posenc.__file__).resolve().parent

ALLOWED = set((PACKAGE / "methods").glob("*.py"))  # the registry: nothing else compares a method name


# "default" (NONE's alias) is left out: it is also transformers' rope_type for plain RoPE, compared in hf/patch.py
NAMES = set(hf_methods()) | {NONE.name}


def _is_name(node) -> bool:
    """A string literal naming a method, or a literal tuple/list/set holding one (``(["none"], ["x"])`` too)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_name(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES


def name_comparisons(source: str) -> list[tuple[int, str]]:
    """Every place a method is chosen by its name: ``x == "yarn"``, ``x != "none"``, ``x in ("pi", ...)``,
    ``"hierarchical" in xs``, ``part.kind == "duo"`` (a part kind that is a method's name), ``case "yarn":``, and a
    dict literal keyed by method names (``{"pi": "linear"}[rule]``, a second registry): (line, code)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) and (_is_name(a) or _is_name(b))
                   for op, a, b in zip(node.ops, operands, operands[1:])):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.MatchValue) and _is_name(node.value):
            found.append((node.lineno, f"case {ast.unparse(node.value)}"))
        elif isinstance(node, ast.Dict) and node.keys and all(k is not None and _is_name(k) for k in node.keys):
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_the_scan_finds_comparisons():
    src = ('if method == "yarn": pass\nok = m != "none"\nx = name in ("pi", "other")\n'
           'y = "hierarchical" in methods\nz = kind == "learned_table"\nw = "rope_type" in d\n'
           'v = emb.kind == "hierarchical"\nu = spec.name == "bca"\nt = names in (["none"], ["default"])\n'
           's = n == "linear"\nr = {"pi": "linear", "ntk": "ntk"}[rule]\nq = {"rope_type": "yarn"}\n'
           'match m:\n    case "dca":\n        pass\n')
    assert [line for line, _ in name_comparisons(src)] == [1, 2, 3, 4, 7, 8, 9, 10, 11, 14]


def test_no_method_name_comparisons_outside_the_registries():
    sources = sorted(p for p in PACKAGE.rglob("*.py") if p not in ALLOWED)
    assert PACKAGE / "evals" / "lab" / "bench.py" in sources and PACKAGE / "hf" / "patch.py" in sources
    offenders = [f"{p.relative_to(PACKAGE.parent)}:{line}: {code}" for p in sources
                 for line, code in name_comparisons(p.read_text(encoding="utf-8"))]
    assert not offenders, "compare record attributes, not method names:\n" + "\n".join(offenders)


@pytest.mark.parametrize("spec, kw, hint", [("yran", {}, "yarn"), ("lineer", {"hf": True}, "linear"),
                                            ("rerope+lgn", {}, "logn"), ("zzzzzz", {}, None)])
def test_an_unknown_name_says_the_closest_known_one(spec, kw, hint):
    """The registry's error carries "did you mean" itself, so a Python caller gets what the command line prints."""
    with pytest.raises(UnknownMethodError) as err:
        parse_methods(spec, **kw)
    said = str(err.value)
    assert (f"(did you mean {hint!r}?)" in said) if hint else ("did you mean" not in said)
