#!/usr/bin/env bash
# Build the documentation site strictly and run every code block of the README and the docs.
#   bash scripts/docs_check.sh            in the venv that scripts/test.sh made (PYGGML_VENV, default .venv)
# A broken link, a missing API reference or a failing code block fails it. The code blocks run on
# the demo model; a block marked <!-- skip: reason --> is reported with its reason.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${PYGGML_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "docs_check: no virtual environment at $VENV (run bash scripts/test.sh first, or set PYGGML_VENV)" >&2
    exit 1
fi
. "$VENV/bin/activate"
# The docs extra, and the plot extra that compare --report needs; the package is already installed
# editable with its compiled kernels, so only the extras' dependencies are added.
python -m pip install -q -e ".[docs,plot]"
export NO_MKDOCS_2_WARNING=1
SITE="$(mktemp -d)"
trap 'rm -rf "$SITE"' EXIT
echo "== mkdocs build --strict"
python -m mkdocs build --strict --site-dir "$SITE"
echo "== code blocks of README.md and docs/"
python -m pytest -q -rs -p no:cacheprovider tests/docs
