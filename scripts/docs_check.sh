#!/usr/bin/env bash
# Build the documentation site strictly and run every code block of the README and the docs.
#   bash scripts/docs_check.sh [PYTEST_ARGS...]   in the venv that scripts/test.sh made (PYGGML_VENV,
#                                                default .venv); the arguments go to the code blocks' pytest
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
# The docs extra, and the plot extra that `compare --report` needs. The package is already installed
# editable with its compiled kernels, so only the extras' own requirements are added (pip install -e
# ".[docs,plot]" would rebuild the kernels for nothing).
mapfile -t REQS < <(python - <<'PY'
import sys

try:
    import tomllib
except ImportError:  # Python 3.10: the TOML reader pip itself ships
    from pip._vendor import tomli as tomllib

extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
if "docs" not in extras:
    sys.exit("docs_check: pyproject.toml has no [docs] extra")
for name in ("docs", "plot"):
    for requirement in extras.get(name, []):
        print(requirement)
PY
)
python -m pip install -q "${REQS[@]}"
export NO_MKDOCS_2_WARNING=1
SITE="$(mktemp -d)"
trap 'rm -rf "$SITE"' EXIT
echo "== mkdocs build --strict"
python -m mkdocs build --strict --site-dir "$SITE"
echo "== code blocks of README.md and docs/"
python -m pytest -q -rs -p no:cacheprovider tests/docs "$@"
