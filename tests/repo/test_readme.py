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
    assert stated_shapes(BLOCKS[0]) == {"out": (1, 4, 4096, 64), "inv_freq": (64,)}
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


BASH = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.slow
def test_readme_extend_and_generate_on_the_bundled_model_run(tmp_path):
    """The README's command-line example on the bundled model runs as written (its --out moved into a temporary
    folder): extend saves a loadable folder and says its size and that the .gguf was de-quantized; generate
    continues the prompt from that folder."""
    import json
    import shlex
    import subprocess
    import sys

    lines = [ln.split("  #")[0].strip() for block in BASH for ln in block.splitlines()
             if ln.startswith(("posenc extend smollm2", "posenc generate runs/smollm2-yarn"))]
    assert len(lines) == 2, lines
    outputs = []
    for line in lines:
        argv = [a.replace("runs/smollm2-yarn", str(tmp_path / "smollm2-yarn")) for a in shlex.split(line)[1:]]
        proc = subprocess.run([sys.executable, "-m", "posenc", *argv, "--quiet"], capture_output=True, text=True,
                              timeout=600, cwd=README.parent)
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    said = json.loads(outputs[0].strip().splitlines()[-1])
    assert said["rope_parameters"]["rope_type"] == "yarn" and "weights in float32" in said["size"]
    assert "de-quantized from the" in said["size"] and ".gguf" in said["size"]
    prompt = "The capital of France is"
    assert outputs[1].startswith(prompt) and len(outputs[1].strip()) > len(prompt)
