"""The API page shows the docstrings' Sphinx roles as plain code (docs/hooks/sphinx_roles.py)."""

from __future__ import annotations

from devscripts import load_script


def test_sphinx_roles_become_plain_code():
    hook = load_script("docs/hooks/sphinx_roles.py")
    html = "after :meth:<code>close</code>, see :class:<code>~pathlib.Path</code> and <code>x</code>"
    assert hook.strip_roles(html) == "after <code>close</code>, see <code>Path</code> and <code>x</code>"
