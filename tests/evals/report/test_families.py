"""posenc.evals.report.families: method families come from the registry, and their colours are distinct."""

from __future__ import annotations

import colorsys
import json
from pathlib import Path

from posenc.evals.report import lab as R
from posenc.evals.report.families import ABSOLUTE, BIAS, FINETUNED, MASK, NOPE, OTHER, REMAP, ROPE, family, palette
from posenc.methods import METHODS

ROOT = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------------------------------ families
def test_families_come_from_the_registry_and_colours_are_distinct():
    assert family("rope", "yarn") == family("rope", "ntk_mixed+logn") == family("rope", None) == ROPE
    assert family("rope", "rerope+logn") == family("rope", "selfextend") == REMAP
    assert family("rope", "streaming_llm") == family("rope", "bca") == MASK
    assert family("alibi", "none") == family("fire", None) == BIAS
    assert family("sinusoidal", None) == family("learned", "hierarchical") == ABSOLUTE
    assert family("nope", None) == NOPE and family("rope_ft_pi", None, ["rope_ft_pi"]) == FINETUNED
    assert family("no_such_scheme", None) == OTHER and family("rope", "no_such_method") == OTHER
    assert {name: family("rope", name) for name in METHODS if family("rope", name) == OTHER} == {}
    results = json.loads((ROOT / "benchmarks/results/archive/bench-standard-recall1-ee4d39d/results.json").read_text())
    rows = [(r["scheme"], r["method"]) for r in results["records"]]
    colours = palette(rows, R.finetune_names(results["meta"]))
    assert len(colours) == len(set(rows)) == len({c["color"] for c in colours.values()})  # never reused
    hues: dict[str, set] = {}
    for c in colours.values():
        h, _, s = colorsys.rgb_to_hls(*c["color"])
        hues.setdefault(c["family"], set()).add(round(h, 3) if s > 0 else "grey")
    assert all(len(h) == 1 for h in hues.values())  # shades within a family, one hue each
    assert len({next(iter(h)) for h in hues.values()}) == len(hues)  # and a different hue per family
