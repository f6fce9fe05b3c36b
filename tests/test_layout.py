"""The package's structure, held as tests: imports point down the layers, with no cycles; no module
uses another's private names; package modules are imported at the top of a module (the CLI
alone imports a command's modules when it runs); one module imports the binding."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pyggml_codec

PKG = Path(pyggml_codec.__file__).resolve().parent
# Layers from the top: a module may import its own layer's modules and any layer below.
LAYERS = [
    {"__main__", "cli"},
    {"dataset"},
    {"diagnostics", "demo", "hub"},
    {"api"},
    {"codec"},
    {"batching"},
    {"streaming"},
    {"engine"},
    {"stream_state"},
    {"io"},
    {"inputs"},
    {"graphs"},
    {"model"},
    {"plan"},
    {"backend"},
    {"_version", "checks", "errors", "progress"},
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["pyggml_codec", *parts])


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports (relative imports resolved), at any depth."""
    tree = ast.parse(path.read_text())
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("pyggml_codec"):
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)  # "from . import ops"
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("pyggml_codec"))
    modules = {_module_name(p) for p in PKG.rglob("*.py")}
    return {m for m in out if m in modules and m not in (here, "pyggml_codec")}  # the face: names only


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PKG.rglob("*.py") if p.name != "__init__.py" or p.parent != PKG}


def _layer(module: str) -> str:
    return module.split(".")[1] if module != "pyggml_codec" else "pyggml_codec"


def test_imports_point_down_the_layers():
    wrong = [(m, t) for m, targets in _graph().items() for t in targets
             if RANK[_layer(t)] < RANK[_layer(m)]]
    print("upward imports:", wrong)
    assert not wrong


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for t in sorted(graph.get(node, ())):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    print("cycles:", cycles)
    assert not cycles


def test_only_the_binding_imports_ggml_python():
    importers = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "ggml" or n.startswith("ggml.") for n in names):
                importers.append(_module_name(path))
    assert sorted(set(importers)) == ["pyggml_codec.backend.binding"]


def _package_imports(node: ast.AST, path: Path) -> list[str]:
    """The package modules an import statement names (relative imports count as the package's)."""
    if isinstance(node, ast.ImportFrom):
        return [node.module or "."] if node.level or (node.module or "").startswith("pyggml_codec") else []
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("pyggml_codec")]
    return []


def function_level_imports() -> list[str]:
    """``file:line module`` of each package import inside a function, outside the CLI (which
    imports a command's modules when that command runs)."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path.relative_to(PKG).parts[0] == "cli":
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{path.relative_to(PKG)}:{n.lineno} {m}" for n in ast.walk(fn)
                          for m in _package_imports(n, path)]
    return sorted(set(found))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses() -> list[str]:
    """``file:line name`` of each use of another module's private name: imported from a package
    module, or read as an attribute of anything but ``self`` / ``cls`` (another module, another
    object), except on names of modules outside the package (``torch._weight_norm``)."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        external = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names if not a.name.startswith("pyggml_codec")}
        external |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                     and not n.level and not (n.module or "").startswith("pyggml_codec") for a in n.names}
        for n in ast.walk(tree):
            where = f"{path.relative_to(PKG)}:{getattr(n, 'lineno', 0)}"
            if isinstance(n, ast.ImportFrom) and _package_imports(n, path):
                found += [f"{where} {a.name}" for a in n.names if _private(a.name)]
            elif isinstance(n, ast.Attribute) and _private(n.attr):
                base = n.value
                if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in external):
                    continue
                found.append(f"{where} {ast.unparse(n)}")
    return found


def test_no_module_uses_another_modules_private_names():
    found = private_uses()
    assert not found, found


def test_package_modules_are_imported_at_module_level():
    found = function_level_imports()
    assert not found, found


def test_the_checks_can_fail(tmp_path, monkeypatch):
    """Each structure check finds a planted violation (a private read, a function-level import,
    an upward import, a cycle), so a pass means something."""
    fake = tmp_path / "pyggml_codec"
    for layer in ("codec", "engine", "errors"):
        (fake / f"{layer}.py").parent.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("")
    (fake / "errors.py").write_text("from . import engine\n")  # upward, and a cycle with engine
    (fake / "engine.py").write_text("from . import errors\n\ndef f(codec):\n    return codec._lock\n")
    (fake / "codec.py").write_text("def g():\n    from . import engine\n")
    monkeypatch.setattr(__import__(__name__), "PKG", fake)
    assert private_uses() == ["engine.py:4 codec._lock"]
    assert function_level_imports() == ["codec.py:2 ."]
    assert ("pyggml_codec.errors", "pyggml_codec.engine") in [(m, t) for m, ts in _graph().items() for t in ts
                                                               if RANK[_layer(t)] < RANK[_layer(m)]]
    with pytest.raises(AssertionError):
        test_no_import_cycles()
