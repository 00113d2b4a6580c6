"""The registry: :data:`METHODS` (inference-time methods, in catalogue order), :data:`TRAINED_METHODS`,
:data:`NONE` (the model as it is), :data:`HF_ONLY` (names only transformers implements), the one parser of
``"a+b"`` compositions (:func:`parse_methods`), and the parameters a method runs with at a length
(:func:`length_defaults`, from each record's ``eval_defaults``).

A record says everything posenc knows about a method (:class:`~posenc.methods.records.Method`). Code elsewhere
reads its attributes; it does not compare method names (``tests/methods/test_registry.py`` scans the source)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from posenc.methods import common, dca, embeddings, masks, remaps, retrieval, scales, schedules, trained
from posenc.methods.records import Method

#: the catalogue's order (``posenc schemes``, docs/methods.md): each family module contributes its records
_FAMILIES = (schedules, remaps, scales, masks, dca, embeddings, retrieval)
_ORDER = (
    "pi",
    "ntk",
    "ntk_mixed",
    "dynamic_ntk",
    "dynamic_ntk_qwen",
    "yarn",
    "dynamic_yarn",
    "llama3",
    "rope_base",
    "rerope",
    "leaky_rerope",
    "selfextend",
    "logn",
    "sliding_window",
    "lm_infinite",
    "streaming_llm",
    "bca",
    "pcw",
    "dca",
    "hierarchical",
    "chunked_attention",
    "temperature_tuning",
    "string",
    "resonance",
    "retrieval",
    "duo",
    "p_rope",
)
_ALL = {m.name: m for family in _FAMILIES for m in family.RECORDS}
assert set(_ALL) == set(_ORDER), "a family's record is missing from the catalogue order, or the other way round"
METHODS: dict[str, Method] = {name: _ALL[name] for name in _ORDER}
TRAINED_METHODS: dict[str, Method] = {m.name: m for m in trained.RECORDS}

#: the model as it is ("none"; "default" is transformers' name for it)
NONE = Method(
    name="none",
    kind="identity",
    description="the model as trained, no method",
    paper="",
    apply=common.identity,
    aliases=("default",),
)

#: methods of transformers' names that posenc.hf.extend hands to transformers by default
HF_ONLY: dict[str, Method] = {m.name: m for m in schedules.TRANSFORMERS_ONLY}
#: transformers' names for posenc's methods where they differ (``linear`` is PI): a native schedule's rope_type
_HF_ALIASES = {m.hf_rope_type: m.name for m in METHODS.values() if m.hf_native and m.hf_rope_type != m.name}


class UnknownMethodError(ValueError):
    """A name that is not a registered method; ``name`` is the unknown part, ``known`` the known names."""

    def __init__(self, name: str, known):
        self.name, self.known = name, sorted(known)
        close = difflib.get_close_matches(str(name), self.known, n=1, cutoff=0.6)  # the CLI's "did you mean" rule
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        super().__init__(f"unknown method {name!r}{hint}; inference-time methods (combine with '+'): {self.known}")


def _table(identity: bool, hf: bool) -> Mapping[str, Method]:
    table: dict[str, Method] = dict(METHODS)
    if identity:
        table.update({n: NONE for n in (NONE.name, *NONE.aliases)})
    if hf:
        table.update(HF_ONLY)
        table.update({alias: METHODS[name] for alias, name in _HF_ALIASES.items()})
    return table


def hf_methods() -> dict[str, Method]:
    """Every name :func:`posenc.hf.extend` accepts (registry, transformers-only methods, ``linear``)."""
    return dict(_table(False, True))


def lookup(name: str, *, identity: bool = True, hf: bool = False) -> Method:
    """The record of one method name; :class:`UnknownMethodError` (a ``ValueError``) listing the known
    names otherwise. ``identity``: ``"none"``/``"default"`` give :data:`NONE`; ``hf``: also the names only
    transformers implements (``linear`` = ``pi``, ``dynamic``, ``longrope``)."""
    table = _table(identity, hf)
    if name not in table:
        raise UnknownMethodError(name, set(METHODS) | (set(HF_ONLY) | set(_HF_ALIASES) if hf else set()))
    return table[name]


def split_spec(spec, what: str = "method") -> list[str]:
    """``"a+b"`` -> ``["a", "b"]`` (names stripped, empty parts dropped); ``ValueError`` for a non-string
    or an empty spec. The one place a composition string is split."""
    if not isinstance(spec, str):
        raise ValueError(f"{what} must be a preset name string (see PositionScheme.presets()), got {spec!r}")
    names = [m.strip() for m in spec.split("+") if m.strip()]
    if not names:
        raise ValueError(f"{what} must be a non-empty preset name, got {spec!r}")
    return names


def method_spec(label: str) -> str:
    """The method spec of a row label: ``"dca@qwen"`` is ``dca`` with the fixed parameters a suite preset gives the
    label ``dca@qwen`` (two rows of one method with different parameters); a label without ``@`` is the spec."""
    return label.split("@", 1)[0]


def parse_methods(spec, *, what: str = "method", identity: bool = True, hf: bool = False) -> tuple[Method, ...]:
    """The records of ``"a+b"``, in order (see :func:`split_spec` and :func:`lookup`)."""
    return tuple(lookup(n, identity=identity, hf=hf) for n in split_spec(spec, what))


def is_identity(spec) -> bool:
    """True for a spec that applies nothing: None, ``""``, ``"none"``, ``"default"`` (or only those,
    joined by ``+``); False for anything else, an unknown name included."""
    if spec is None or spec == "":
        return True
    try:
        return all(m.is_identity for m in parse_methods(spec))
    except ValueError:
        return False


def length_defaults(
    method: str, train_len: int, eval_len: int, *, head_dim: int | None = None, base: float = 10000.0, hf: bool = False
) -> dict:
    """The parameters to read ``eval_len`` tokens with a model trained at ``train_len``, from each record's
    ``eval_defaults`` (``posenc schemes`` states every method's rule; ``"a+b"`` merges, the first method's value
    wins on a shared key, as ``PositionScheme.extend`` routes a parameter to the first method accepting it).
    ``hf``: also the methods only a Hugging Face model takes (``longrope``), as :func:`parse_methods` reads them."""
    out: dict = {}
    for m in parse_methods(method, hf=hf):
        for k, v in m.length_defaults(train_len, eval_len, head_dim, base).items():
            out.setdefault(k, v)
    return out


def method_params(method: str, params: dict | None, *, hf: bool = False) -> dict:
    """The part of ``params`` that the methods of ``method`` (``"a+b"``) take (all of them for a method that
    transformers alone runs, ``hf=True``: transformers validates its rope parameters)."""
    methods = parse_methods(method, hf=hf)
    if hf and len(methods) == 1 and methods[0].hf_native:
        return dict(params or {})
    accepted = {k for m in methods for k in m.param_names}
    return {k: v for k, v in (params or {}).items() if k in accepted}


def check_method_params(methods: Sequence[str], params: dict | None, *, hf: bool = False) -> None:
    """``ValueError`` for a parameter that none of ``methods`` takes (it would be ignored), naming the
    parameters each method takes; nothing to check without ``params``."""
    if not params:
        return
    real = []
    for m in methods:
        try:
            if not all(r.is_identity for r in parse_methods(m, hf=hf)):
                real.append(m)
        except ValueError:
            continue  # an unknown name is reported where it is used (an error record, or check_eval_args)
    if not real:
        raise ValueError(f"method parameters {sorted(params)} were given but no method takes them: name the "
                         f"methods (e.g. --methods yarn)")
    used = set().union(*(method_params(m, params, hf=hf) for m in real))
    unused = sorted(set(params) - used)
    if unused:
        takes = {m: sorted({k for r in parse_methods(m, hf=hf) for k in r.param_names}) for m in real}
        raise ValueError(f"parameter(s) {unused} are taken by none of the methods {real} (each takes: {takes}); "
                         f"they would be ignored")
