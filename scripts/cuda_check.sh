#!/usr/bin/env bash
# The CUDA check, for a machine with an NVIDIA GPU, nvcc, cmake and PyTorch but no package
# registry. Two halves:
#   bash scripts/cuda_check.sh prepare   (here, with the registry) puts what that machine lacks into
#                                        .cuda-carry/: the ggml-python sdist and the wheels the
#                                        package and its tests need, and the reference wheels
#   bash scripts/cuda_check.sh run       (there, from the repository root, .cuda-carry/ carried along)
#                                        builds ggml-python with -DGGML_CUDA=on for sm_90 (H200),
#                                        then runs the GPU tests (parity, fallback placement,
#                                        remembered failure, bench-backends) on backend cuda and
#                                        bench-backends at 1 s and 10 s; all output in $OUT (or cuda_out/)
# Carry to that machine the ignored folders .cuda-carry/ and .oracle_wheels/ (about 12 MB).
# Environment: CUDA_ARCH (default 90), PYGGML_CUDA_VENV (default .cuda-venv), PYVER for prepare.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CARRY="$PWD/.cuda-carry"
GGML_VERSION="$(sed -n 's/.*"ggml-python==\([0-9.]*\)".*/\1/p' pyproject.toml)"

case "${1:-}" in
prepare)
    mkdir -p "$CARRY"
    python3 -m pip download -q --no-deps --no-binary :all: -d "$CARRY" "ggml-python==$GGML_VERSION"
    # Wheels for the GPU machine's Python (PYVER, default this one's): the package's run-time and
    # test dependencies and the build requirements of both packages. Left out, as that machine
    # has them: torch, numpy (PyTorch's), cmake, and the HTTP stack gguf never uses offline.
    pyver="${PYVER:-$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}"
    python3 -m pip download -q -d "$CARRY" --only-binary :all: --python-version "$pyver" \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        gguf soundfile cffi soxr pytest einops hypothesis typing-extensions "setuptools>=64" wheel \
        scikit-build-core pyyaml tqdm
    rm -f "$CARRY"/cmake-*.whl "$CARRY"/ninja-*.whl "$CARRY"/numpy-*.whl "$CARRY"/requests-*.whl \
        "$CARRY"/urllib3-*.whl "$CARRY"/certifi-*.whl "$CARRY"/idna-*.whl "$CARRY"/charset_normalizer-*.whl
    python3 -m pip download -q --no-deps -d .oracle_wheels \
        fish-speech==0.1.0 descript-audio-codec==1.0.0 descript-audiotools==0.7.2
    du -sh "$CARRY" .oracle_wheels
    ;;
run)
    OUT_DIR="${OUT:-$PWD/cuda_out}"
    mkdir -p "$OUT_DIR"
    exec > >(tee "$OUT_DIR/cuda_check.log") 2>&1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    VENV="${PYGGML_CUDA_VENV:-.cuda-venv}"
    python3 -m venv --system-site-packages "$VENV"  # the machine's torch and numpy
    . "$VENV/bin/activate"
    pip_offline=(python -m pip install -q --no-index --find-links "$CARRY")
    echo "-- ggml-python with -DGGML_CUDA=on ($(date -u +%T))"
    start=$(date +%s)
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}" \
        CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "${pip_offline[@]}" --no-cache-dir --force-reinstall --no-deps "$CARRY"/ggml_python-*.tar.gz
    echo "-- built in $(( $(date +%s) - start )) s"
    "${pip_offline[@]}" --no-deps setuptools wheel packaging gguf soundfile cffi pycparser soxr pytest pluggy iniconfig pygments einops hypothesis \
        sortedcontainers pyyaml tqdm typing-extensions
    "${pip_offline[@]}" --no-build-isolation --no-deps -e .
    python - <<'PY'
import sys
import pyggml_codec
for d in pyggml_codec.devices():
    print(f"   {d.index}: {d.backend} {d.name} ({d.description}, {d.memory_total >> 20} MB)")
sys.exit(0 if "cuda" in pyggml_codec.available_backends() else "cuda check: this build reports no CUDA device")
PY
    export PYGGML_ORACLE_WHEELS="$PWD/.oracle_wheels"
    echo "-- GPU tests on cuda ($(date -u +%T))"
    set +e
    timeout 300 python -m pytest -q -s -m gpu --gpu-backend cuda tests/vulkan -p no:cacheprovider \
        --junitxml="$OUT_DIR/gpu_tests.xml"
    rc=$?
    echo "-- bench-backends, tiny model, 1 s and 10 s ($(date -u +%T))"
    python - "$OUT_DIR" <<'PY'
import subprocess, sys
from pathlib import Path
sys.path.insert(0, "tests")
import models, oracle
out = Path(sys.argv[1])
m = models.make_converted(oracle.TINY, out / "tiny", seed=0)
for seconds in ("1", "10"):
    for precision in ("f32", "s2cpp"):
        path = m.f32_path if precision == "f32" else m.f16_path
        subprocess.run([sys.executable, "-m", "pyggml_codec", "bench-backends", "-m", str(path), "--seconds", seconds,
                        "--precision", precision, "--json", str(out / f"bench_{precision}_{seconds}s.json")],
                       check=False, timeout=300)
PY
    set -e
    exit "$rc"
    ;;
*)
    echo "usage: bash scripts/cuda_check.sh prepare|run" >&2
    exit 2
    ;;
esac
