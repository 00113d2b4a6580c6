"""The README's Python examples run as written and give the shapes the README states (docs that drift are
worse than none)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
# `name = ...  # ... [2, 100, 256] ...`: a shape the README states in a comment
STATED = re.compile(r"^(\w+) = [^#\n]*#[^\[\n]*\[(\d+(?:, \d+)*)\]", flags=re.M)
# shapes the examples imply without a comment: prompt length + max_new_tokens, HF logits over the vocab
IMPLIED = [{}, {"out": (2, 30 + 8)}, {"logits": (1, 256, 300), "new": (1, 20 + 5)}, {}, {}]


def stated_shapes(block: str) -> dict[str, tuple[int, ...]]:
    return {name: tuple(int(x) for x in dims.split(", ")) for name, dims in STATED.findall(block)}


def test_readme_has_python_examples_with_stated_shapes():
    assert len(BLOCKS) == len(IMPLIED)
    assert stated_shapes(BLOCKS[0]) == {"out": (1, 4, 4096, 64)}
    assert stated_shapes(BLOCKS[1]) == {"y": (2, 100, 256)}
    assert stated_shapes(BLOCKS[3]) == {"logits": (1, 6, 257)}
    assert stated_shapes(BLOCKS[4]) == {"pos": (1, 196, 2), "z": (2, 196, 192)}


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i):
    ns: dict = {}
    exec(compile(BLOCKS[i], f"README.md[python block {i}]", "exec"), ns)
    expected = {**stated_shapes(BLOCKS[i]), **IMPLIED[i]}
    assert expected
    for name, shape in expected.items():
        assert tuple(ns[name].shape) == shape, f"block {i}: {name}"


def test_readme_method_table_names_every_preset_and_method():
    """The front page's compact method table is typed by hand: it must name every trained-in preset and every
    inference-time method of the registry, and nothing else (``longrope`` is transformers' own: HF_ONLY)."""
    from posenc import PositionScheme
    from posenc.methods import HF_ONLY, METHODS

    text = README.read_text()
    section = text[text.index("## Methods"):text.index("## Latest results")]
    rows = [line.split("|")[2] for line in section.splitlines() if line.startswith("| ") and "| family |" not in line]
    names = set(re.findall(r"`(\w+)`", "\n".join(rows)))
    registered = set(METHODS) | set(PositionScheme.presets())
    assert registered <= names, sorted(registered - names)
    assert names <= registered | set(HF_ONLY), sorted(names - registered - set(HF_ONLY))
