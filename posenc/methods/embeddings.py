"""Methods on an absolute embedding: Su's hierarchical decomposition of a learned table
(:mod:`posenc.parts.absolute`)."""

from __future__ import annotations

from dataclasses import replace

from posenc.methods.records import Method, Param
from posenc.scheme.part import Part


def _hierarchical(m: Method, scheme, alpha=None):
    if scheme.embedding.kind != "learned":
        raise ValueError(
            f"method {m.name!r} reads a learned absolute table; {scheme.name!r} has a "
            f"{scheme.embedding.kind!r} embedding"
        )
    params = dict(scheme.embedding.params)
    if alpha is not None:
        params["alpha"] = m.param("alpha").checked(m.name, alpha)  # now, not when a model builds the table
    return replace(scheme, embedding=Part(m.name, params))


RECORDS = (
    Method(
        name="hierarchical",
        kind="embedding",
        description="Su: read a learned table through its hierarchical decomposition (n^2)",
        paper="https://kexue.fm/archives/7947",
        apply=_hierarchical,
        params=(Param(name="alpha", default=0.4, minimum=0.0, maximum=1.0, strict=True, strict_max=True),),
        sets=("embedding",),
        base_preset="learned",
    ),
)
