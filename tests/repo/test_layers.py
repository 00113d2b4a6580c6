"""The layers of the package, checked on its source: what may import what, sizes, and where argparse lives."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import posenc

PACKAGE = Path(posenc.__file__).resolve().parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
# any use of argparse: importing it, or the parser calls a module would make with it
ARGPARSE_USE = re.compile(r"\bargparse\b|\.add_argument\(|\.add_parser\(|\badd_subparsers\(")

# Lowest first. A module may import its own layer and the layers below it, never one above.
# posenc/__init__.py is the public facade over all of them and is checked apart.
LAYERS = (
    ("posenc._util", "posenc._figures", "posenc._version", "posenc._moved", "posenc.runtime"),
    ("posenc.data",),
    ("posenc.tasks",),
    ("posenc.parts",),
    ("posenc.scheme", "posenc.methods"),
    ("posenc.engine",),
    ("posenc.models",),
    ("posenc.training",),
    ("posenc.analysis",),
    ("posenc.hf",),
    ("posenc.evals",),
    ("posenc.cli", "posenc.__main__"),
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


MODULES = {_module_name(p): p for p in SOURCES}


def _layer(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")


def _imports(module: str) -> set[str]:
    """Every posenc module ``module`` imports, at module level or inside a function."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # "from posenc.x import y": y may be a module of package posenc.x
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # "posenc.x.Class" -> "posenc.x"
                name = name.rpartition(".")[0]
            if name.startswith("posenc") and name != module:
                found.add(name)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_module_has_a_layer():
    assert "posenc.engine" in MODULES and "posenc.parts.rotary" in MODULES  # it scans the package
    for module in MODULES:
        if module != "posenc":
            _layer(module)


def test_a_lower_layer_never_imports_a_higher_one():
    offenders = [f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
                 for m, deps in GRAPH.items() if m != "posenc"
                 for d in sorted(deps) if d != "posenc" and _layer(d) > _layer(m)]
    facade = [f"{m} imports the facade posenc" for m, deps in GRAPH.items() if m != "posenc" and "posenc" in deps]
    assert not offenders + facade, "\n".join(offenders + facade)


def test_no_import_cycles():
    """Function-level imports count: a cycle means two modules cannot be understood apart. A package's
    ``__init__`` re-exporting its own modules is not a cycle (the modules do not import it back)."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(GRAPH[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_argparse_only_under_cli():
    """The command line lives in posenc/cli/; the library modules take plain keyword arguments."""
    cli = PACKAGE / "cli"
    assert PACKAGE / "__init__.py" in SOURCES and PACKAGE / "scheme" / "core.py" in SOURCES  # it scans the library
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
                 for path in SOURCES if cli not in path.parents
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if ARGPARSE_USE.search(line)]
    assert not offenders, "argparse outside posenc/cli/:\n" + "\n".join(offenders)


def test_no_tracker_references_in_code():
    """Code says what it does and why; issue numbers and session notes belong in the tracker."""
    pattern = re.compile(r"(?<!transformers )\b(?:issue|ticket)s? #?\d+|\bsession note", re.IGNORECASE)
    roots = [PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "benchmarks"]
    offenders = [f"{p.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
                 for root in roots for p in sorted(root.rglob("*.py"))
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if pattern.search(line) and p.name != "test_layers.py"]
    assert not offenders, "\n".join(offenders)


MODULE_BACKSTOP, FUNCTION_BACKSTOP = 1000, 120  # lines: far past one idea; the rule is one idea per module


def test_module_and_function_sizes():
    """The rule is one idea per module (docs/architecture.md, "Rooms"); these backstops catch a module or function
    that has grown far past one idea, not a file that should be squeezed under a number."""
    long_modules = [f"{p.relative_to(PACKAGE.parent)}: {n} lines" for p in SOURCES
                    if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_BACKSTOP]
    long_functions = [f"{p.relative_to(PACKAGE.parent)}:{f.lineno} {f.name}: {f.end_lineno - f.lineno + 1} lines"
                      for p in SOURCES for f in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and f.end_lineno - f.lineno + 1 > FUNCTION_BACKSTOP]
    assert not long_modules + long_functions, "\n".join(long_modules + long_functions)


def test_old_import_paths_are_the_moved_modules_for_one_release():
    """A module that moved (``posenc._moved.MOVED``) still imports under its old path, as the same module object, with
    a FutureWarning naming the new path; an old package finds each of its old modules; no posenc module imports an
    old path."""
    import importlib
    import sys
    import warnings

    from posenc._moved import MOVED, PACKAGES

    for old, new in MOVED.items():
        sys.modules.pop(old, None)  # imported by an earlier iteration: import it afresh, so it warns again
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = importlib.import_module(old)
        if old not in PACKAGES:
            assert got is importlib.import_module(new), old
        said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
        assert any(f"{old} moved to {new}" in m for m in said), (old, said)
    lab = importlib.import_module("posenc.lab")
    assert lab.checkpoint is importlib.import_module("posenc.models.checkpoint")
    old_users = {m: sorted(i for i in GRAPH[m] if i in MOVED) for m in MODULES}
    assert not {m: u for m, u in old_users.items() if u}, old_users
