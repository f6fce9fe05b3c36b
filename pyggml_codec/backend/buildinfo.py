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
REBUILD = ('CMAKE_ARGS="-DGGML_LLAMAFILE=ON" pip install --no-cache-dir --force-reinstall --no-deps '
           'ggml-python=={version}')


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
        "openmp": "OPENMP" in enabled,
        "machine_isa_unused_by_build": unused,
        "kernels": {"compiled": kernels.AVAILABLE, "reason": kernels.UNAVAILABLE_REASON},
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
        f"OpenMP          {'on' if info['openmp'] else 'off'}",
        f"CPU kernels     {'compiled, in use on the CPU' if kern['compiled'] else 'unavailable: ' + str(kern['reason'])}",
        f"BLAS            {blas_line}",
    ]
    lines += [f"warning: {w}" for w in info["warnings"]]
    if not info["warnings"]:
        lines.append("ok: the CPU runs the compiled kernels and the BLAS")
    lines.append(f"to rebuild ggml-python with other flags: {REBUILD.format(version=info['ggml_python'])}")
    return "\n".join(lines)
