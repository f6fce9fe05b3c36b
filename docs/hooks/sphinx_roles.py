"""MkDocs hook: the docstrings' Sphinx roles (``:meth:`close```) shown as plain code.

The API page renders the docstrings as Markdown, where ``:meth:`close``` becomes the text
":meth:" followed by ``close`` in code. This hook drops the role and keeps the code; a leading
``~`` (Sphinx's "last component only") keeps the last dotted component.
"""

from __future__ import annotations

import re

ROLE = re.compile(r":(?:py:)?(?:meth|func|class|attr|mod|exc|data|obj|const):<code>(~?)([^<]*)</code>")


def _code(match: re.Match) -> str:
    name = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
    return f"<code>{name}</code>"


def strip_roles(html: str) -> str:
    return ROLE.sub(_code, html)


def on_page_content(html: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs hook signature
    return strip_roles(html)
