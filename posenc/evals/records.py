"""The evaluation record: one row of ``posenc eval`` / ``posenc bench`` results, one (model, method, length).

:class:`EvalRecord` is the only place the row's schema is written out. It is built by
:func:`posenc.evals.lab.evaluate.evaluate_model`, :func:`posenc.evals.pretrained.evaluate_hf` and
:func:`posenc.evals.lab.bench.run_bench`,
and read back from ``results.json`` by :mod:`posenc.evals.report.lab`. :meth:`EvalRecord.to_dict` gives the JSON keys::

    {"scheme", "method", ["params",] "train_len", "eval_len", "ppl", "loss", "accuracy", "tokens",
     "passkey", "status", "note", [extra keys such as "run_dir", "corpus", "split"]}

and :meth:`EvalRecord.from_dict` reads them back (``from_dict(d).to_dict() == d`` for any such dict).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EvalRecord", "REQUIRED_KEYS", "RETRIEVAL_KEYS", "RETRIEVAL_TASKS", "RetrievalRecord"]

# every record carries these keys (a missing one reads back as None)
REQUIRED_KEYS = ("scheme", "method", "train_len", "eval_len", "ppl", "loss", "accuracy", "tokens", "passkey",
                 "status", "note")


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation result of a model under an inference-time method at one length.

    ``method`` is ``"none"`` for the model as trained. ``passkey`` is a mean exact-match rate, a dict
    ``{"accuracy", "cells"}`` (bench) or None. ``status`` is ``"ok"``, ``"not_applicable"`` or ``"error"``
    with the reason in ``note``. ``params`` (the method's parameters) is None where the producer does not
    record them (Hugging Face evaluation), and is then left out of :meth:`to_dict`. ``extra`` holds further
    keys (``run_dir``, ``corpus``, ``split`` ...) written after the schema's own.
    """

    scheme: str | None
    method: str | None
    train_len: int | None
    eval_len: int | None
    ppl: float | None = None
    loss: float | None = None
    accuracy: float | None = None
    tokens: int | None = 0
    passkey: Any = None
    status: str | None = "ok"
    note: str | None = ""
    params: dict | None = None
    extra: dict = field(default_factory=dict)

    def replace(self, **changes) -> EvalRecord:
        """A copy with ``changes`` (the record is frozen)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The JSON row: :data:`REQUIRED_KEYS` (``params`` after ``method`` when set), then ``extra``."""
        out: dict = {"scheme": self.scheme, "method": self.method}
        if self.params is not None:
            out["params"] = dict(self.params)
        out.update({k: getattr(self, k) for k in REQUIRED_KEYS[2:]})
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, row: dict) -> EvalRecord:
        """Read a JSON row back; a missing required key is None, unknown keys go to ``extra``."""
        known = {*REQUIRED_KEYS, "params"}
        return cls(**{k: row.get(k) for k in REQUIRED_KEYS}, params=row.get("params"),
                   extra={k: v for k, v in row.items() if k not in known})


# ------------------------------------------------------------------------------------------ retrieval
# every retrieval record carries these keys, in this order (``results.json["retrieval"]``)
RETRIEVAL_KEYS = ("task", "scheme", "method", "train_len", "eval_len", "distance", "accuracy", "n", "chance")
RETRIEVAL_TASKS = ("recall", "kv_recall", "offset", "passkey", "niah_mk", "niah_keys", "niah_mq", "niah_mv", "vt",
                   "cwe")
# recall: posenc.tasks.recall's single needle, a content-copy control (the only value of the window); kv_recall and
# offset: posenc.tasks.kv_recall (key matching among distractor values; the token 2 after the key); passkey:
# Landmark's pass key (posenc.tasks.passkey and the long-context suite); the rest are the long-context suite's query
# kinds (posenc.tasks.ruler.QUERY_KINDS). Bench rows carry the model's training seed as extra["seed"], and
# rows of scheme "content_copy" are the control of kv_recall / offset (posenc.evals.lab.probes)


@dataclass(frozen=True)
class RetrievalRecord:
    """One retrieval measurement: ``accuracy`` (exact match over ``n`` trials) of ``scheme`` under
    ``method`` at ``eval_len`` tokens when the needle is ``distance`` tokens before the question.

    ``task`` is ``"recall"`` (key-value recall in text, :mod:`posenc.tasks.recall`), ``"passkey"``
    (Landmark-format passkey, :mod:`posenc.tasks.passkey`; ``distance`` = tokens from the key line to the end
    of the question) or a query kind of the long-context suite (:mod:`posenc.tasks.ruler`; ``distance`` =
    mean tokens from the farthest needle to the end of the context). ``chance`` is the accuracy of a guess
    (None when not defined). ``params`` holds the method's parameters (left out of :meth:`to_dict` when None);
    ``extra`` further keys.
    """

    task: str
    scheme: str
    method: str
    train_len: int
    eval_len: int
    distance: int
    accuracy: float
    n: int
    chance: float | None = None
    params: dict | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.task not in RETRIEVAL_TASKS:
            raise ValueError(f"RetrievalRecord.task must be one of {RETRIEVAL_TASKS}, got {self.task!r}")
        if not 0.0 <= float(self.accuracy) <= 1.0:
            raise ValueError(f"RetrievalRecord.accuracy must be in [0, 1], got {self.accuracy!r}")
        for name in ("train_len", "eval_len", "distance", "n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"RetrievalRecord.{name} must be a positive integer, got {v!r}")
        if self.distance >= self.eval_len:
            raise ValueError(f"RetrievalRecord.distance ({self.distance}) must be < eval_len ({self.eval_len})")

    def to_dict(self) -> dict:
        """The JSON row: :data:`RETRIEVAL_KEYS`, ``params`` when set, then ``extra``."""
        out = {k: getattr(self, k) for k in RETRIEVAL_KEYS}
        if self.params is not None:
            out["params"] = dict(self.params)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, row: dict) -> RetrievalRecord:
        """Read a JSON row back (``from_dict(d).to_dict() == d``); unknown keys go to ``extra``."""
        missing = [k for k in RETRIEVAL_KEYS if k not in row and k != "chance"]
        if missing:
            raise ValueError(f"retrieval record lacks {missing}; keys: {list(RETRIEVAL_KEYS)}")
        known = {*RETRIEVAL_KEYS, "params"}
        return cls(**{k: row.get(k) for k in RETRIEVAL_KEYS}, params=row.get("params"),
                   extra={k: v for k, v in row.items() if k not in known})
