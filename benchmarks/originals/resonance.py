"""Run sheryc/resonance_rope's own Llama (``llama_finetuning/scaled_rope/modeling_llama_yarn.py``, unchanged) on a
fixed tiny Llama and record its logits, for ``tests/parts/test_resonance.py`` to compare posenc against.

The original is not committed: the script reads its two files from a git checkout at a pinned commit (``--source``,
e.g. a clone of github.com/sheryc/resonance_rope) into a temporary package, in a separate environment with the
transformers it was written for (``--make-venv DIR`` creates one: torch 2.13 CPU, transformers 4.36.2, einops)::

    python -m benchmarks.originals.resonance --make-venv /tmp/reso-venv
    /tmp/reso-venv/bin/python benchmarks/originals/resonance.py --source /path/to/resonance_rope \\
        --out tests/fixtures/originals/resonance.json

Weights come from :func:`tiny_weights` (a generator seeded per parameter name), so posenc's side builds the same
model without the fixture carrying them. Two cases: plain Resonance RoPE, and Resonance-YaRN (factor 2), both read
at 80 tokens, beyond the 32 the model "trained" at.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

COMMIT = "4a7f5a703b2e96756939db51916937ab7c5ab3a9"
FILES = ("llama_finetuning/scaled_rope/modeling_llama_yarn.py", "llama_finetuning/scaled_rope/configuration_llama.py")
CONFIG = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=64, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
TRAIN_LEN, LENGTH = 32, 80
CASES = {"resonance": None, "resonance+yarn": {"type": "yarn", "factor": 2.0,
                                               "original_max_position_embeddings": TRAIN_LEN}}


def tiny_weights(model) -> None:
    """Fill every parameter of ``model`` from a generator seeded by its name (norms around 1, the rest 0.08 x N(0, 1)),
    identically on both sides."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            seed = int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)
            x = torch.randn(p.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
            p.copy_(1.0 + 0.1 * x if "norm" in name else 0.08 * x)


def input_ids() -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (1, LENGTH), generator=torch.Generator().manual_seed(7))


def _put(path: Path, text: str) -> None:
    """Write ``text`` atomically (a temp file in the same folder, then ``os.replace``): this script runs in the
    original's environment, where posenc's own writer may not be importable."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _load_original(source: Path, commit: str):
    tmp = Path(tempfile.mkdtemp()) / "scaled_rope"
    tmp.mkdir()
    _put(tmp / "__init__.py", "")
    for f in FILES:
        text = subprocess.run(["git", "-C", str(source), "show", f"{commit}:{f}"], check=True, capture_output=True,
                              text=True).stdout
        _put(tmp / Path(f).name, text)
    sys.path.insert(0, str(tmp.parent))
    from scaled_rope.configuration_llama import LlamaConfig
    from scaled_rope.modeling_llama_yarn import LlamaForCausalLM

    return LlamaConfig, LlamaForCausalLM


def record(source: Path, out: Path, commit: str = COMMIT) -> None:
    import transformers

    LlamaConfig, LlamaForCausalLM = _load_original(source, commit)
    ids = input_ids()
    cases = {}
    for name, scaling in CASES.items():
        cfg = LlamaConfig(**CONFIG, max_position_embeddings=TRAIN_LEN if scaling is None else 2 * TRAIN_LEN,
                          rope_scaling=scaling)
        cfg.resonance_rope = True
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
        tiny_weights(model)
        with torch.no_grad():
            logits = model(ids).logits[0]
        cases[name] = [[round(float(x), 6) for x in row] for row in logits]
    _put(out, json.dumps({"original": "sheryc/resonance_rope", "commit": commit, "files": list(FILES),
                               "transformers": transformers.__version__, "torch": torch.__version__,
                               "config": CONFIG, "train_len": TRAIN_LEN, "ids": input_ids()[0].tolist(),
                               "logits": cases}, indent=0) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, help="a git checkout of sheryc/resonance_rope")
    ap.add_argument("--commit", default=COMMIT)
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/originals/resonance.json"))
    ap.add_argument("--make-venv", type=Path, help="create the original's environment here and exit")
    args = ap.parse_args(argv)
    if args.make_venv is not None:
        subprocess.run([sys.executable, "-m", "venv", str(args.make_venv)], check=True)
        subprocess.run([str(args.make_venv / "bin" / "pip"), "install", "-q", "torch==2.13.0", "transformers==4.36.2",
                        "einops"], check=True)
        return 0
    if args.source is None:
        ap.error("--source is required (a git checkout of sheryc/resonance_rope)")
    record(args.source, args.out, args.commit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
