"""posenc.methods.conventions: the conventions table of docs/guides/conventions.md is the registry's."""

from __future__ import annotations

from posenc.methods import METHODS


# ============================================================================ conventions
def test_docs_conventions_table_is_the_registrys():
    from pathlib import Path

    from posenc.methods.conventions import conventions_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "conventions.md").read_text(encoding="utf-8")
    assert conventions_table() in page, "regenerate docs/guides/conventions.md's table: conventions_table()"
    for name in ("streaming_llm", "selfextend", "dca", "string", "retrieval", "duo", "lm_infinite"):
        assert any(p.original for p in METHODS[name].params), name
    assert "recent_size + 1" in METHODS["streaming_llm"].param("window").describe()
