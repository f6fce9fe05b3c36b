#!/usr/bin/env bash
# Create the virtual environment with pyggml_codec and its test extra, and fetch the
# reference wheels. Sourced by test.sh and bench.sh.
# Environment: PYGGML_VENV (default .venv), TORCH_SPEC (default torch==2.13.0, a CPU build),
# CMAKE_ARGS (default -DGGML_LLAMAFILE=OFF, ggml's and s2.cpp's default: the build whose F16 products
# the s2cpp precision reproduces bit for bit; add -DGGML_CUDA=on etc.; a cached ggml-python wheel
# that does not match what was asked is rebuilt).
# Under CI (CI set) or PYGGML_REQUIRE (tests/conftest.py) every step must succeed: the [ray]
# extra must install and `pyggml-codec doctor` must report no warning. Elsewhere both only warn.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${PYGGML_VENV:-.venv}"
STRICT=""
if [ -n "${CI:-}" ] || [ -n "${PYGGML_REQUIRE:-}" ]; then STRICT=1; fi
python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_LLAMAFILE=OFF}"
python -m pip install -q -e ".[test]"
# The corpus job's extra: its tests skip (saying so) where Ray has no wheel for this Python or platform;
# under CI or PYGGML_REQUIRE its failure to install is a failure.
if [ -n "$STRICT" ]; then
    python -m pip install -q -e ".[ray]"
else
    python -m pip install -q -e ".[ray]" || echo "warning: the [ray] extra did not install; its tests will skip" >&2
fi
# pip reuses a ggml-python wheel from its cache without a word, and CMAKE_ARGS is then ignored:
# rebuild when its llamafile setting is not what was asked, or it lacks an ISA extension this machine has.
if ! python - <<'PY'
import os, sys
from pyggml_codec.backend import buildinfo
args = os.environ.get("CMAKE_ARGS", "")
want_llamafile = "-DGGML_LLAMAFILE=ON" in args
info = buildinfo.build_info()
stale = want_llamafile != info["llamafile"] or info["machine_isa_unused_by_build"]
if stale:
    print(f"ggml-python from pip's cache does not match this machine or CMAKE_ARGS "
          f"(llamafile {info['llamafile']}, unused ISA {info['machine_isa_unused_by_build']}): rebuilding")
sys.exit(1 if stale else 0)
PY
then
    GGML_PY="ggml-python==$(python -c 'from pyggml_codec.backend import binding; print(binding.binding_version())')"
    python -m pip install -q --no-cache-dir --force-reinstall --no-deps "$GGML_PY"
fi
# The independent reference: upstream's PyTorch codec from three PyPI wheels, never installed.
python -m pip download -q --no-deps -d .oracle_wheels \
    fish-speech==0.1.0 descript-audio-codec==1.0.0 descript-audiotools==0.7.2
export PYGGML_ORACLE_WHEELS="$PWD/.oracle_wheels"
# What the build runs (ggml, llamafile, ISA, kernels, BLAS). It exits 1 on a warning: fatal under CI
# or PYGGML_REQUIRE, shown otherwise.
if [ -n "$STRICT" ]; then
    pyggml-codec doctor
else
    pyggml-codec doctor || echo "warning: doctor reports the problems above; the tests run anyway" >&2
fi
