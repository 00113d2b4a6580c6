"""The scheme: :class:`PositionScheme`, the typed, composable description of how a model encodes position
(trained parts plus inference-time methods, whose records are :mod:`posenc.methods`), its parts (:class:`Part`) and
per-layer patterns (``pattern``).

The names are read from their modules on first use: the method records import ``posenc.scheme.part`` and
``posenc.scheme.core`` imports the records, so this package must not import ``core`` before anything asks for it
(``import posenc.methods`` first then works as well as ``import posenc.scheme`` first)."""

__all__ = ["TRAINED", "Part", "PositionScheme", "RopeSpec"]

_HOME = {"TRAINED": "posenc.scheme.core", "PositionScheme": "posenc.scheme.core", "RopeSpec": "posenc.scheme.core",
         "Part": "posenc.scheme.part"}


def __getattr__(name):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'posenc.scheme' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
