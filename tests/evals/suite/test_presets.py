"""posenc.evals.suite.presets: every preset is valid and documented; the paired preset adds only new pass keys at
16k to the full run's cells."""

import pytest

from posenc.evals.suite import SuitePreset


def test_presets_are_valid_and_documented():
    from posenc.evals.suite.presets import SUITE_PRESETS

    short, full = SUITE_PRESETS["smollm2"].sized(8192), SUITE_PRESETS["smollm2_full"]  # derived from L = 8192
    assert short.lengths == (8192, 16384) and full.lengths == (4096, 8192, 16384, 32768)
    assert set(short.methods) <= set(full.methods)  # a full run holds every cell of the short one
    assert full.reference_length == 8192 == short.reference_length  # SmolLM2's trained length
    wanted = {"pi", "ntk", "ntk_mixed", "dynamic_ntk", "yarn", "dynamic_yarn", "llama3", "rerope", "leaky_rerope",
              "selfextend", "dca", "rerope+logn", "streaming_llm", "lm_infinite", "sliding_window"}
    assert wanted <= set(full.methods) and full.methods[0] == "none"
    kinds = {g for c in full.contexts for g in c.generators}
    assert kinds == {"niah", "passkey", "mv", "vt", "cwe"}
    for name, rows in (("smollm2_tune16k", {"longrope@tune16k", "longrope@engine16k"}),
                       ("smollm2_tune32k", {"ntk@tune32k", "longrope@tune32k", "longrope@engine32k"})):
        tuned = SUITE_PRESETS[name]  # shares smollm2_full's cells: same contexts, its rows but the tuned ones
        assert tuned.contexts == full.contexts and set(tuned.methods) - set(full.methods) == rows
    with pytest.raises(ValueError, match="first method"):
        SuitePreset("x", "y", methods=("yarn",), contexts=short.contexts)
    with pytest.raises(ValueError, match="reference_length"):
        SuitePreset("x", "y", lengths=(1024,), reference_length=4096, contexts=short.contexts)


def test_the_paired_preset_adds_only_new_pass_keys_at_16k_to_the_full_runs_cells():
    """``smollm2_paired16k`` reads ``smollm2_full``'s cells: every cell they both plan has the same key (same
    parameters per row), and what it adds is pass-key seeds 4-11 at 16k, none of which the full run has."""
    from posenc.evals.suite.presets import SUITE_PRESETS
    from posenc.evals.suite.spec import cell_key, method_params, plan

    full, paired = SUITE_PRESETS["smollm2_full"], SUITE_PRESETS["smollm2_paired16k"]
    assert set(paired.methods) <= set(full.methods) and set(paired.compare_to) <= set(paired.methods)

    def keys(preset):  # cell key -> (length, seed) of the cells the preset plans for the paired rows
        return {repr(cell_key("m", meth, method_params(meth, 8192, n, 64, 1e5, preset.params), n, spec, s, False)):
                (n, s) for n, meth, spec, s in plan(preset) if meth in paired.methods and n in paired.lengths}

    ours, theirs = keys(paired), keys(full)
    added = [ours[k] for k in set(ours) - set(theirs)]
    assert sorted(added) == sorted((16384, s) for s in range(4, 12) for _ in paired.methods)
    assert set(theirs) <= set(ours)  # every full-run cell of these rows at 8k and 16k is one of the paired preset's
    extra = paired.contexts[-1]
    assert not extra.used_at(8192) and extra.used_at(16384) and extra.used_at(32768)


def test_the_review_preset_plans_two_dozen_keys_per_cell_and_shares_the_short_presets_cells():
    """``smollm2_review``: every (row, length) plans at least 24 keys up to 16k and 12 at 32k (2 per prefill), 4
    perplexity passages at every length and 8 up to 16k for the five rows the page compares, and its cells at 8k
    and 16k for the rows it shares with ``smollm2`` have the short preset's keys (the committed suite-smollm2-keys
    cells are read, not recomputed)."""
    from posenc.evals.suite.presets import SUITE_PRESETS
    from posenc.evals.suite.spec import cell_key, method_params, plan

    review = SUITE_PRESETS["smollm2_review"].sized(8192)
    short = SUITE_PRESETS["smollm2"].sized(8192)
    assert review.lengths == (8192, 12288, 16384, 32768) and len(review.methods) == 17
    for n in review.lengths:
        for meth in review.methods:
            cells = [(spec, s) for nn, mm, spec, s in plan(review) if (nn, mm) == (n, meth)]
            keys = sum(spec.options["keys"]["n_keys"] for spec, _ in cells if "keys" in spec.generators)
            passages = sum(1 for spec, _ in cells if spec.haystack == "book")
            wanted = 8 if n <= 16384 and meth in ("none", "yarn", "selfextend", "dca", "rerope") else 4
            assert keys == (24 if n <= 16384 else 12) and passages == wanted, (meth, n, keys, passages)

    def keys(preset, rows):
        return {repr(cell_key("m", meth, method_params(meth, 8192, n, 64, 1e5, preset.params), n, spec, s, False))
                for n, meth, spec, s in plan(preset)
                if meth in rows and n in (8192, 16384) and spec.name != "noise:passkey" and spec.methods is None}

    shared = set(review.methods) & set(short.methods)
    assert shared == {"none", "yarn", "selfextend"} and keys(short, shared) == keys(review, shared)


def test_the_gemma3_preset_plans_a_dozen_keys_and_the_same_two_passages_at_every_length():
    """``gemma3`` on Gemma 3 270M (L = 32768): 16k-128k, every (row, length) plans 12 keys (3 prefills of 4) and
    2 book passages whose keys differ only in the length (the passages lie past 128k of the book: the same tokens
    scored at every length), so the rows at 128k hold the 8 keys the page needs and more."""
    from posenc.evals.suite.presets import SUITE_PRESETS
    from posenc.evals.suite.spec import plan

    gemma = SUITE_PRESETS["gemma3"].sized(32768)
    assert gemma.lengths == (16384, 32768, 65536, 131072) and gemma.reference_length == 32768
    assert len(gemma.methods) == 10 and gemma.prune_from == 131072
    for n in gemma.lengths:
        for meth in gemma.methods:
            cells = [(spec, s) for nn, mm, spec, s in plan(gemma) if (nn, mm) == (n, meth)]
            keys = sum(spec.options["keys"]["n_keys"] for spec, _ in cells if "keys" in spec.generators)
            books = sorted((spec.target, spec.reach, s) for spec, s in cells if spec.haystack == "book")
            assert keys == 12 and books == [(2048, 131072, 0), (2048, 131072, 1)], (meth, n, keys, books)
