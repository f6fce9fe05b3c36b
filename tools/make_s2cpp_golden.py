"""Write the golden s2.cpp dumps the test suite checks the "s2cpp" precision against.

    python tools/make_s2cpp_golden.py --s2cpp S2CPP_TREE [--cmake-arg=-DGGML_NATIVE=OFF ...]

Builds the harness (pyggml_codec/diagnostics/s2cpp_harness) against the s2.cpp tree, runs it on the
committed tiny model (tests/golden/s2cpp/tiny_f16_s0.gguf, made by the test fixtures:
oracle.TINY, seed 0, F16) at 1 and 2 threads, checks that both agree, and writes
tests/golden/s2cpp/<isa>/{decode,encode}.npz, the ISA key being that of the harness's ggml build
(avx512fp16, avx512 or avx2; buildinfo.isa_key). For the AVX2 set on an AVX-512 machine:
    --cmake-arg=-DGGML_NATIVE=OFF --cmake-arg=-DGGML_AVX=ON --cmake-arg=-DGGML_AVX2=ON
    --cmake-arg=-DGGML_FMA=ON --cmake-arg=-DGGML_F16C=ON --cmake-arg=-DGGML_BMI2=ON
For the avx512 set on a machine with AVX512-FP16 (its native build is avx512fp16; an explicit
-mno- outranks -march=native in GCC and Clang):
    --cmake-arg=-DCMAKE_C_FLAGS=-mno-avx512fp16 --cmake-arg=-DCMAKE_CXX_FLAGS=-mno-avx512fp16
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np

from pyggml_codec.diagnostics import s2cpp

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "s2cpp"
MODEL = GOLDEN / "tiny_f16_s0.gguf"
FRAMES = 12  # past the tiny RVQ transformer's window (8): its window mask is exercised


def golden_inputs() -> tuple[np.ndarray, np.ndarray]:
    """(codes (10, FRAMES) int32, mono float32 audio of FRAMES frames less 300 samples): fixed."""
    rng = np.random.default_rng(7)
    codes = np.stack([rng.integers(0, s, FRAMES) for s in (64,) + (32,) * 9]).astype(np.int32)
    t = np.arange(FRAMES * 2048 - 300) / 44100
    voice = np.sin(2 * np.pi * 180 * t) + 0.5 * np.sin(2 * np.pi * 360 * t + 0.3) + 0.25 * np.sin(2 * np.pi * 900 * t)
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2
    audio = (0.3 * voice * envelope + 0.01 * rng.standard_normal(t.size)).astype(np.float32)
    return codes, audio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s2cpp", required=True, help="an s2.cpp source tree with its ggml submodule")
    ap.add_argument("--cmake-arg", action="append", default=[], help="passed to the harness's cmake configure")
    ap.add_argument("--build-dir", default=None)
    args = ap.parse_args()
    if not MODEL.is_file():
        sys.exit(f"{MODEL} is missing (it is committed; regenerate with tests/models.make_tiny_gguf, seed 0, f16)")
    exe = s2cpp.build_harness(args.s2cpp, args.build_dir, args.cmake_arg)
    info = s2cpp.harness_info(exe)
    isa = s2cpp.isa_key(info)
    if isa is None:
        sys.exit(f"the harness's ggml build has no golden-set ISA: {info}")
    try:
        commit = subprocess.run(["git", "-C", args.s2cpp, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    codes, audio = golden_inputs()
    meta = {"s2cpp_commit": commit, "isa": isa, "model": MODEL.name,
            "model_sha256": hashlib.sha256(MODEL.read_bytes()).hexdigest(), "cmake_args": args.cmake_arg}
    for kind, data in (("decode", codes), ("encode", audio)):
        one, two = (s2cpp.run_harness(exe, kind, MODEL, data, threads) for threads in (1, 2))
        for name in one.stages:
            if not np.array_equal(one.stages[name], two.stages[name]):
                sys.exit(f"s2.cpp's own {kind} differs between 1 and 2 threads at {name}")
        path = s2cpp.save_golden(one, GOLDEN / isa / f"{kind}.npz", {**meta, "threads_checked": [1, 2]})
        print(f"{path}: {len(one.stages)} stages ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
