"""cffi build script for the small C kernels ggml runs as custom ops on the CPU backend.

Built at install time (``setup.py`` lists it in ``cffi_modules``) into
``pyggml_codec.backend._kernels``. The kernels read ggml tensors through a mirror of the first
fields of ``struct ggml_tensor`` (ggml 0.15.3); ``kernels.py`` checks those offsets
against the binding's own struct before using them. The C sources are in ``csrc/``:
``elementwise.c`` (Snake, fused bias passes, F16 im2col, col2im, transposes), ``blas.c`` (products and
per-tap convs through a CBLAS sgemm), ``winograd.c`` (the Winograd conv), ``rowdot.c`` (row
products), ``attention.c`` (streamed attention read in place from the key/value arena, and a whole
sequence's causal window attention in one op), ``scratch.c`` (scratch buffers kept between calls),
``timeline.c`` (the kernels' calls timed per thread inside a whole compute), ``pg_kernels.h``.

Snake: ggml's ``sin`` is a scalar loop, so the 5-op chain runs at a fraction of PyTorch's
speed; one pass with glibc's vectorized ``sinf`` (libmvec, enabled by -ffast-math) was
measured 16-20x faster than the chain on this project's machines (PERF_NOTES.md).
"""

import os
import re
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
C_SOURCES = ["elementwise.c", "blas.c", "winograd.c", "rowdot.c", "attention.c", "scratch.c", "timeline.c"]  # in csrc/, with the shared pg_kernels.h


def _exports() -> str:
    """The prototypes between the "cffi exports" markers of pg_kernels.h (declared once, there)."""
    with open(os.path.join(HERE, "csrc", "pg_kernels.h")) as f:
        header = f.read()
    return header.split("/* cffi exports: begin */")[1].split("/* cffi exports: end */")[0]


EXACT_ONLY = ("pg_mul_mat_f16dot", "pg_f16dot_product", "pg_f16dot_lanes", "pg_f16dot_pairs_max_steps",  # ggmldot.c: in the exact build alone
              "pg_sinf_exact", "pg_sinf_exact_check", "pg_sinf_exact_use", "pg_sinf_exact_lanes")  # and elementwise.c's
CDEF = "\n".join(line for line in _exports().splitlines() if not any(f" {name}(" in line for name in EXACT_ONLY))


def _relative(path: str) -> str:  # setuptools wants sources relative to the project root (the cwd of a build)
    return os.path.relpath(path)


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
_flags = ["-O3", "-ffast-math"]  # -ffast-math (with finite-math) makes glibc declare the SIMD sinf
# PYGGML_CODEC_MARCH names another target than this CPU, e.g. x86-64-v3 (AVX2, FMA, F16C: the
# kernels a CPU without AVX-512 runs, built and tested on one with it)
_MARCH = os.environ.get("PYGGML_CODEC_MARCH") or "native"  # unset or empty: this CPU
if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", _MARCH):
    raise ValueError(f"PYGGML_CODEC_MARCH={_MARCH!r}: not a -march target name")
if os.environ.get("PYGGML_CODEC_PORTABLE") != "1" and sys.platform != "darwin":
    _flags.append(f"-march={_MARCH}")
ffibuilder.set_source(
    "pyggml_codec.backend._kernels",
    '#include "pg_kernels.h"\n',
    sources=[_relative(os.path.join(HERE, "csrc", name)) for name in C_SOURCES],
    include_dirs=[_relative(os.path.join(HERE, "csrc"))],
    extra_compile_args=_flags,
    libraries=["m", "mvec"] if sys.platform.startswith("linux") else ["m"],
)

# The exact build (the "s2cpp" precision): the elementwise kernels and ggml's F16 product
# (ggmldot.c), compiled without -ffast-math and without FMA contraction, so that Snake, the fused
# bias passes, the F16 conversions and the products compute ggml's values bit for bit (scalar libm
# sinf, a true division by alpha, sums in the written order; see PG_EXACT in elementwise.c).
EXACT_SOURCES = ["elementwise.c", "ggmldot.c", "scratch.c"]
EXACT_EXPORTS = ("pg_tensor_layout", "pg_has_f16c", "pg_scratch_failures", "pg_snake", "pg_im2col", "pg_bias_snake",
                 "pg_add_bias_residual", "pg_col2im") + EXACT_ONLY


def _exact_cdef() -> str:
    lines = [line for line in _exports().splitlines() if any(f" {name}(" in line for name in EXACT_EXPORTS)]
    return "\n".join(lines) + "\n"


exact_builder = FFI()
exact_builder.cdef(_exact_cdef())
exact_builder.set_source(
    "pyggml_codec.backend._kernels_exact",
    '#include "pg_kernels.h"\n',
    sources=[_relative(os.path.join(HERE, "csrc", name)) for name in EXACT_SOURCES],
    include_dirs=[_relative(os.path.join(HERE, "csrc"))],
    extra_compile_args=["-O3", "-fno-fast-math", "-ffp-contract=off", "-DPG_EXACT"] + _flags[2:],
    libraries=["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
    exact_builder.compile(verbose=True)
