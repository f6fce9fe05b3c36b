"""What this install actually runs: the ggml build (version, compiled CPU features such as the
ISA, llamafile and OpenMP), this project's compiled kernels and the BLAS they call, and
where the package was imported from. ``pyggml-codec doctor`` prints it.

pip reuses a cached ggml-python wheel without a word, so ``CMAKE_ARGS`` given at install
time may not be what the build has; this report is the only reliable answer.
"""

from __future__ import annotations

import os
import platform

from . import binding, kernels

# ggml's feature names for the x86 ISA extensions, and the /proc/cpuinfo flag of each
_ISA_FLAGS = {"AVX": "avx", "AVX2": "avx2", "F16C": "f16c", "FMA": "fma", "AVX512": "avx512f"}  # the ones
# ggml's F16/F32 dot products and conversions are compiled for; a build without one runs slower
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # backend/ -> the package
REBUILD = ('CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" pip install --no-cache-dir --force-reinstall --no-deps '
           'ggml-python=={version}')


def isa_key(features: dict) -> str | None:
    """The summation order of ggml's F16 dot product in a build with these CPU features
    (``ggml_cpu_has_*`` or ``ggml_backend_get_features`` names, plus ``f16_dot_half`` from
    :func:`binding.f16_dot_sums_in_half`, which ggml does not report): "avx512fp16" (a build
    for AVX512-FP16: 32 half-precision lanes, steps of 128), "avx512" (16 float lanes) or
    "avx2" (8 float lanes, with FMA and F16C); None for other builds. Bit-exactness with
    s2.cpp holds between builds of one key; the golden s2.cpp dumps are kept per key. A
    GGML_NATIVE build on a CPU with AVX512-FP16 (Sapphire Rapids and later) is "avx512fp16",
    on one without (e.g. Skylake-X to Ice Lake, AMD Zen 4) "avx512": the features ggml reports are the
    same, the sums are not."""
    f = {str(k).lower(): v not in ("", "0", 0, False, None) for k, v in features.items()}
    if f.get("avx512"):
        return "avx512fp16" if f.get("f16_dot_half") else "avx512"
    if f.get("avx2") and f.get("fma") and f.get("f16c"):
        return "avx2"
    return None


def build_isa_key() -> str | None:
    """:func:`isa_key` of this ggml build (its reported features and its measured F16 sums)."""
    return isa_key({**binding.cpu_features(), "f16_dot_half": binding.f16_dot_sums_in_half()})


def s2cpp_exactness() -> dict:
    """Whether this ggml build can reproduce s2.cpp's CPU build bit for bit in the "s2cpp"
    precision: {"exact": True/False/None (not verified), "isa": key, "reason": text}.

    LLAMAFILE routes F16 products through tinyBLAS, which sums in another order than the
    ``ggml_vec_dot_f16`` of s2.cpp's default build (LLAMAFILE off): measured 5e-4 rel RMS."""
    isa = build_isa_key()
    if binding.has_llamafile():
        return {"exact": False, "isa": isa, "reason": (
            "this ggml build has LLAMAFILE on: its F16 products (tinyBLAS) sum in another order than "
            "s2.cpp's default build, so precision='s2cpp' is within F16 rounding of s2.cpp (about 5e-4 rel "
            f"RMS), not bit-exact; rebuild: {REBUILD.format(version=binding.binding_version())}")}
    if isa is None:
        return {"exact": None, "isa": None, "reason": (
            "this ggml build has neither AVX-512 nor AVX2+FMA+F16C: bit-exactness with s2.cpp is not verified "
            "for its ISA (compare with your own s2.cpp build: pyggml-codec s2cpp-compare)")}
    return {"exact": True, "isa": isa, "reason": (
        f"bit-exact with s2.cpp's CPU build of the same ISA ({isa}, LLAMAFILE off, its default flags)")}


def source_tree() -> str | None:
    """The checkout this package was imported from, if it was (a pyproject.toml beside it)."""
    root = os.path.dirname(PACKAGE)
    return root if os.path.exists(os.path.join(root, "pyproject.toml")) else None


def slow_path_reason(blas: bool = True) -> str | None:
    """Why the CPU would run plain ggml ops (about 2.5x slower) or ggml's F32 products, with
    the fix; None when the compiled kernels and the BLAS are both in use, or the BLAS was
    switched off on purpose (``PYGGML_CODEC_BLAS=off``)."""
    if not kernels.AVAILABLE:
        tree = source_tree()
        if tree is not None and "not built" in (kernels.UNAVAILABLE_REASON or ""):
            fix = (f"pyggml_codec was imported from the source tree {tree}, which has no compiled kernels: "
                   f"run `pip install -e .` there (it builds them in place), or run from outside the "
                   f"checkout to use the installed copy")
        else:
            fix = "reinstall pyggml_codec with a C compiler present (pip install --force-reinstall --no-deps .)"
        return f"compiled CPU kernels unavailable ({kernels.UNAVAILABLE_REASON}); the CPU runs plain ggml ops, about 2.5x slower. Fix: {fix}"
    if blas and kernels.BLAS is None and not kernels.BLAS_UNAVAILABLE_REASON.startswith("disabled by"):
        return (f"BLAS matrix products unavailable ({kernels.BLAS_UNAVAILABLE_REASON}); F32 products and convs run "
                f"on ggml's kernels, about 2x slower. Fix: install numpy from its wheels (they bundle "
                f"OpenBLAS >= 0.3.27) or point {kernels.BLAS_ENV} at such a library")
    return None


def machine_flags() -> set[str] | None:
    """The CPU flags Linux reports for this machine, or None where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return set()


def build_info() -> dict:
    """The report as a dict (``doctor --json``)."""
    features = binding.cpu_features()
    enabled = sorted(name for name, value in features.items() if value not in ("", "0"))
    flags = machine_flags()
    unused = sorted(name for name, flag in _ISA_FLAGS.items()
                    if enabled and flags and flag in flags and name not in enabled)  # none known: none unused
    info = {
        "python": platform.python_version(),
        "package": PACKAGE,
        "source_tree": source_tree() is not None,
        "ggml": binding.ggml_version(),
        "ggml_python": binding.binding_version(),
        "cpu_features": enabled,
        "llamafile": binding.has_llamafile(),
        "s2cpp_exact": s2cpp_exactness(),
        "openmp": "OPENMP" in enabled,
        "machine_isa_unused_by_build": unused,
        "kernels": {"compiled": kernels.AVAILABLE, "reason": kernels.UNAVAILABLE_REASON},
        "exact_kernels": exact_kernels(),
        "blas": kernels.BLAS.describe() if kernels.BLAS is not None else {"reason": kernels.BLAS_UNAVAILABLE_REASON},
        "warnings": [],
    }
    slow = slow_path_reason()
    if slow:
        info["warnings"].append(slow)
    if unused:
        info["warnings"].append(
            f"this machine has {', '.join(unused)} but the ggml build does not use it (a wheel built "
            f"elsewhere, e.g. from pip's cache); rebuild: {REBUILD.format(version=info['ggml_python'])}")
    return info


def exact_kernels() -> dict:
    """What the "s2cpp" precision's compiled kernels run here: ggml's products in register blocks
    (lanes, or why ggml's mul_mat runs them) and libm's sinf in vectors (lanes, or why the Snake
    calls libm per value). Either way the values are ggml's."""
    return {"compiled": kernels.EXACT_AVAILABLE, "reason": kernels.EXACT_UNAVAILABLE_REASON,
            "products_lanes": kernels.F16DOT_LANES, "products_reason": kernels.F16DOT_UNAVAILABLE_REASON,
            "sinf_lanes": kernels.SINF_LANES, "sinf_reason": kernels.SINF_UNAVAILABLE_REASON}


def format_exact_kernels(e: dict) -> str:
    """One line for :func:`exact_kernels`."""
    if not e["compiled"]:
        return f"unavailable: {e['reason']} (the s2cpp precision runs ggml's ops)"
    products = (f"ggml's products in blocks ({e['products_lanes']} lanes)" if e["products_lanes"]
                else f"ggml's mul_mat ({e['products_reason']})")
    sines = (f"libm's sinf in vectors ({e['sinf_lanes']} lanes)" if e["sinf_lanes"]
             else f"libm's sinf per value ({e['sinf_reason']})")
    return f"{products}; {sines}"


def exact_word(e: dict) -> str:
    """"yes", "NO" or "unverified" for an :func:`s2cpp_exactness` report."""
    return {True: "yes", False: "NO", None: "unverified"}[e["exact"]]


def format_build_info(info: dict) -> str:
    blas = info["blas"]
    if "path" in blas:
        blas_line = (f"{blas.get('config') or blas['path']} (kernel {blas.get('corename')}, "
                     f"{blas['threading']}) at {blas['path']}")
    else:
        blas_line = f"unavailable: {blas['reason']}"
    kern = info["kernels"]
    lines = [
        f"python          {info['python']}",
        f"pyggml_codec    {info['package']}{' (a source tree)' if info['source_tree'] else ''}",
        f"ggml            {info['ggml']} (ggml-python {info['ggml_python']})",
        f"CPU features    {' '.join(info['cpu_features']) or 'none reported'}",
        f"llamafile       {'on' if info['llamafile'] else 'off'}",
        f"s2cpp exact     {exact_word(info['s2cpp_exact'])}: {info['s2cpp_exact']['reason']}",
        f"OpenMP          {'on' if info['openmp'] else 'off'}",
        f"CPU kernels     {'compiled, in use on the CPU' if kern['compiled'] else 'unavailable: ' + str(kern['reason'])}",
        f"s2cpp kernels   {format_exact_kernels(info['exact_kernels'])}",
        f"BLAS            {blas_line}",
    ]
    lines += [f"warning: {w}" for w in info["warnings"]]
    if not info["warnings"]:
        lines.append("ok: the CPU runs the compiled kernels and the BLAS")
    lines.append(f"to rebuild ggml-python with other flags: {REBUILD.format(version=info['ggml_python'])}")
    return "\n".join(lines)
