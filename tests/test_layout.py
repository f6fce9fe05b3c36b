"""The package's structure, held as tests: imports point down the layers, with no cycles; one
module imports the binding; the flat module paths of 0.1 still import, as the same modules."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import pyggml_codec

PKG = Path(pyggml_codec.__file__).resolve().parent
# Layers from the top: a module may import its own layer's modules and any layer below.
LAYERS = [
    {"__main__", "cli"},
    {"dataset"},
    {"tools"},
    {"api"},
    {"codec"},
    {"streaming", "batching", "stream_state"},
    {"io"},
    {"inputs"},
    {"graphs"},
    {"model"},
    {"backend"},
    {"_version", "errors", "progress"},
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
    return {m for m in out if m in modules and m != here}


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


def test_modules_stay_under_400_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long


@pytest.mark.parametrize("old, new", sorted(pyggml_codec._MOVED.items()))
def test_moved_module_paths_still_import(old, new):
    via_import = importlib.import_module(f"pyggml_codec.{old}")
    assert via_import is importlib.import_module(f"pyggml_codec.{new}")
    assert getattr(pyggml_codec, old) is via_import
    assert via_import.__spec__.name == f"pyggml_codec.{new}"  # the module keeps its own name


def test_documented_names_at_their_old_paths():
    from pyggml_codec.audio import read_audio, resample, write_audio  # noqa: F401
    from pyggml_codec.codefiles import read_codes, write_codes  # noqa: F401
    from pyggml_codec.demo import build_demo_model  # noqa: F401
    from pyggml_codec.diagnostics import dump_decode, load_dump, save_dump  # noqa: F401
    from pyggml_codec.kernels import BLAS, BLAS_UNAVAILABLE_REASON  # noqa: F401
    with pytest.raises(ImportError):
        importlib.import_module("pyggml_codec.no_such_module")
