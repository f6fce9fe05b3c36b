#!/usr/bin/env bash
# Install pyggml_codec with its test extra into a virtual environment and run the tests.
#   bash scripts/test.sh                       the default suite
#   bash scripts/test.sh --run-slow -m slow    the full-size (slow) tests only
set -euo pipefail
. "$(dirname "$0")/setup.sh"
python -m pytest -q "$@"
