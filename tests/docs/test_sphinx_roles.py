"""The API page shows the docstrings' Sphinx roles as plain code (docs/hooks/sphinx_roles.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sphinx_roles_become_plain_code():
    spec = importlib.util.spec_from_file_location("sphinx_roles", ROOT / "docs" / "hooks" / "sphinx_roles.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    html = "after :meth:<code>close</code>, see :class:<code>~pathlib.Path</code> and <code>x</code>"
    assert hook.strip_roles(html) == "after <code>close</code>, see <code>Path</code> and <code>x</code>"
