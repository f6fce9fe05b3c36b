#!/usr/bin/env bash
# Create the virtual environment with pyggml_codec and its test extra, and fetch the
# reference wheels. Sourced by test.sh and bench.sh.
# Environment: PYGGML_VENV (default .venv), TORCH_SPEC (default torch==2.13.0, a CPU build),
# CMAKE_ARGS (default -DGGML_LLAMAFILE=ON: ggml's fast CPU matmuls; add -DGGML_CUDA=on etc.).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${PYGGML_VENV:-.venv}"
python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
CMAKE_ARGS="${CMAKE_ARGS:--DGGML_LLAMAFILE=ON}" python -m pip install -q -e ".[test]"
# The independent reference: upstream's PyTorch codec from three PyPI wheels, never installed.
python -m pip download -q --no-deps -d .oracle_wheels \
    fish-speech==0.1.0 descript-audio-codec==1.0.0 descript-audiotools==0.7.2
export PYGGML_ORACLE_WHEELS="$PWD/.oracle_wheels"
python -c "import pyggml_codec as p; print('pyggml_codec', p.__version__, '| ggml', p._ggml.ggml_version(), '| llamafile', p._ggml.has_llamafile(), '| CPU kernels', p.kernels.AVAILABLE, '| BLAS', p.kernels.BLAS.path if p.kernels.BLAS else p.kernels.BLAS_UNAVAILABLE_REASON)"
