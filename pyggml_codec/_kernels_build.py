"""cffi build script for the small C kernels ggml runs as custom ops on the CPU backend.

Built at install time (``setup.py`` lists it in ``cffi_modules``) into
``pyggml_codec._kernels``. The kernels read ggml tensors through a mirror of the first
fields of ``struct ggml_tensor`` (ggml 0.15.3); ``kernels.py`` checks those offsets
against the binding's own struct before using them. The C sources are in ``csrc/``:
``elementwise.c`` (Snake, fused bias passes, F16 im2col, col2im), ``blas.c`` (products and
per-tap convs through a CBLAS sgemm), ``winograd.c`` (the Winograd conv), ``pg_kernels.h``.

Snake: ggml's ``sin`` is a scalar loop, so the 5-op chain runs at a fraction of PyTorch's
speed; one pass with glibc's vectorized ``sinf`` (libmvec, enabled by -ffast-math) was
measured 16-20x faster than the chain on this project's machines (PERF_NOTES.md).
"""

import os
import sys

from cffi import FFI

CDEF = """
void pg_snake(void * dst, void * x, void * alpha, int ith, int nth, void * userdata);
void pg_im2col(void * dst, int ith, int nth, void * userdata);
void pg_bias_snake(void * dst, int ith, int nth, void * userdata);
void pg_add_bias_residual(void * dst, int ith, int nth, void * userdata);
void pg_mul_mat_blas(void * dst, int ith, int nth, void * userdata);
void pg_conv_taps(void * dst, int ith, int nth, void * userdata);
void pg_conv_wino(void * dst, int ith, int nth, void * userdata);
void pg_col2im(void * dst, int ith, int nth, void * userdata);
int pg_has_f16c(void);
int pg_tensor_layout(int64_t * offsets);
"""

HERE = os.path.dirname(os.path.abspath(__file__))
C_SOURCES = ["elementwise.c", "blas.c", "winograd.c"]  # in csrc/, with the shared pg_kernels.h


def _relative(path: str) -> str:  # setuptools wants sources relative to the project root (the cwd of a build)
    return os.path.relpath(path)


ffibuilder = FFI()
ffibuilder.cdef(CDEF)
_flags = ["-O3", "-ffast-math"]  # -ffast-math (with finite-math) makes glibc declare the SIMD sinf
if os.environ.get("PYGGML_CODEC_PORTABLE") != "1" and sys.platform != "darwin":
    _flags.append("-march=native")
ffibuilder.set_source(
    "pyggml_codec._kernels",
    '#include "pg_kernels.h"\n',
    sources=[_relative(os.path.join(HERE, "csrc", name)) for name in C_SOURCES],
    include_dirs=[_relative(os.path.join(HERE, "csrc"))],
    extra_compile_args=_flags,
    libraries=["m", "mvec"] if sys.platform.startswith("linux") else ["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
