"""What an install runs, made visible: ``doctor``, and the warning a user gets when the CPU
would run the slow path (a source tree without the compiled kernels)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pyggml_codec
from pyggml_codec.backend import binding, buildinfo, kernels

REPO = Path(__file__).resolve().parents[2]


def _cli(*argv: str, cwd: Path = REPO, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "pyggml_codec", *argv], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def test_doctor_reports_the_build_it_runs():
    out = _cli("doctor", "--json")
    info = json.loads(out.stdout)
    print(json.dumps(info, indent=2))
    assert info["ggml"] == binding.ggml_version() and info["ggml_python"] == binding.binding_version()
    assert info["llamafile"] == binding.has_llamafile()
    assert ("LLAMAFILE" in info["cpu_features"]) == info["llamafile"]
    assert info["kernels"]["compiled"] == kernels.AVAILABLE
    assert ("path" in info["blas"]) == (kernels.BLAS is not None)
    if kernels.BLAS is not None:
        assert info["blas"]["corename"] and info["blas"]["threading"] in ("pthreads", "openmp", "sequential")
    assert out.returncode == (1 if info["warnings"] else 0)
    text = _cli("doctor")
    assert f"ggml            {info['ggml']}" in text.stdout and "--force-reinstall" in text.stdout


def test_doctor_names_the_openblas_kernel_choice(require, monkeypatch):
    """OPENBLAS_CORETYPE changes OpenBLAS's kernel; the report says which one runs. The child
    is run without the variable, then with it naming a kernel other than that one (on x86-64
    DYNAMIC_ARCH builds, such as numpy's, Nehalem or SandyBridge), and the report must follow.
    Measured here: SkylakeX with the variable unset, Nehalem when it names Nehalem."""
    require("blas", kernels.BLAS is not None, f"no BLAS: {kernels.BLAS_UNAVAILABLE_REASON}")
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    native = json.loads(_cli("doctor", "--json").stdout)["blas"]
    print("OpenBLAS kernel:", native["corename"], "| config:", native["config"])
    assert native["corename"]
    if "DYNAMIC_ARCH" not in native["config"] or os.uname().machine not in ("x86_64", "AMD64"):
        pytest.skip(f"this OpenBLAS has one kernel ({native['config']}): OPENBLAS_CORETYPE cannot change it")
    other = "SandyBridge" if native["corename"].lower() == "nehalem" else "Nehalem"
    monkeypatch.setenv("OPENBLAS_CORETYPE", other)
    forced = json.loads(_cli("doctor", "--json").stdout)["blas"]
    print(f"OPENBLAS_CORETYPE={other}: OpenBLAS kernel {forced['corename']}")
    assert forced["corename"].lower() == other.lower()


def test_backends_prints_the_build_line():
    out = _cli("backends")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"ggml {binding.ggml_version()}") and "llamafile" in out.stdout


def test_a_source_tree_without_kernels_warns_with_the_fix(tiny_model, tmp_path):
    """Importing a checkout that has no compiled kernels (a plain ``pip install .`` then a run
    from the checkout) must not be silently 2.5x slower: load() warns, naming the fix."""
    tree = tmp_path / "checkout"
    shutil.copytree(REPO / "pyggml_codec", tree / "pyggml_codec",
                    ignore=shutil.ignore_patterns("_kernels*.so", "_kernels*.pyd", "__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tree / "pyproject.toml")
    script = (  # an editable install's finder would supply the kernels of this repository: drop it
        "import sys, warnings\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in getattr(f, '__name__', type(f).__name__)]\n"
        "import pyggml_codec\n"
        "assert pyggml_codec.__file__.startswith(%r), pyggml_codec.__file__\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    pyggml_codec.load(%r, 'cpu', n_threads=1).close()\n"
        "print([(w.category.__name__, str(w.message)) for w in caught])\n" % (str(tree), str(tiny_model.f32_path)))
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tree, env=env, timeout=120)
    print(out.stdout, out.stderr[-2000:])
    assert out.returncode == 0
    assert "PerformanceWarning" in out.stdout and "pip install -e ." in out.stdout and str(tree) in out.stdout
    doctor_script = script.split("import pyggml_codec\n")[0] + "from pyggml_codec.__main__ import main\nsys.exit(main(['doctor']))\n"
    doctor = subprocess.run([sys.executable, "-c", doctor_script], capture_output=True, text=True, cwd=tree, env=env,
                            timeout=120)
    print(doctor.stdout)
    assert doctor.returncode == 1 and "warning: compiled CPU kernels unavailable" in doctor.stdout


def test_no_performance_warning_on_a_full_install(tiny_model, recwarn):
    if buildinfo.slow_path_reason() is not None:
        pytest.skip(f"this install runs the slow path: {buildinfo.slow_path_reason()}")
    pyggml_codec.load(tiny_model.f32_path, "cpu", n_threads=1).close()
    assert not [w for w in recwarn if issubclass(w.category, pyggml_codec.PerformanceWarning)]


def test_machine_isa_the_build_lacks_is_reported(monkeypatch):
    """A ggml wheel built on an older machine (pip's cache) runs without AVX-512 on a newer
    one: doctor says so and gives the rebuild line."""
    monkeypatch.setattr(buildinfo, "machine_flags", lambda: {"avx2", "avx512f"})
    monkeypatch.setattr(binding, "cpu_features", lambda: {"AVX2": "1", "LLAMAFILE": "1"})
    info = buildinfo.build_info()
    assert info["machine_isa_unused_by_build"] == ["AVX512"]
    assert any("--no-cache-dir --force-reinstall" in w for w in info["warnings"])


def test_doctor_says_what_the_exact_kernels_run():
    """The s2cpp precision's kernels: products in blocks and sinf in vectors where they reproduce
    ggml and libm here, else the reason each falls back (same values, slower)."""
    info = buildinfo.build_info()
    e = info["exact_kernels"]
    assert e["compiled"] == kernels.EXACT_AVAILABLE and e["sinf_lanes"] == kernels.SINF_LANES
    line = next(l for l in buildinfo.format_build_info(info).splitlines() if l.startswith("s2cpp kernels"))
    print(line)
    off = dict(e, compiled=True, products_lanes=0, products_reason="no AVX2", sinf_lanes=0, sinf_reason="another libm")
    assert buildinfo.format_exact_kernels(off) == "ggml's mul_mat (no AVX2); libm's sinf per value (another libm)"
    on = dict(e, compiled=True, products_lanes=16, sinf_lanes=4)
    assert buildinfo.format_exact_kernels(on) == "ggml's products in blocks (16 lanes); libm's sinf in vectors (4 lanes)"
    assert "unavailable: x" in buildinfo.format_exact_kernels(dict(e, compiled=False, reason="x"))


@pytest.mark.parametrize("march,ok", [("x86-64-v3", True), ("native", True), ("", True), ("x86-64; rm -rf", False),
                                      ("-O0", False)])
def test_kernel_target_is_a_march_name_or_refused(march, ok):
    """``PYGGML_CODEC_MARCH`` picks the kernels' ``-march`` target (CI builds x86-64-v3 kernels on an
    AVX-512 machine to run the AVX2 paths); anything but a target name is refused before a compiler
    sees it; unset or empty, the kernels target this CPU."""
    env = dict(os.environ, PYGGML_CODEC_MARCH=march)
    env.pop("PYGGML_CODEC_PORTABLE", None)
    code = "from pyggml_codec.backend import _kernels_build as b; print([f for f in b._flags if f.startswith('-march')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    if ok:
        assert out.returncode == 0, out.stderr
        if sys.platform != "darwin":
            assert out.stdout.strip() == f"['-march={march or 'native'}']"
    else:
        assert out.returncode != 0 and "PYGGML_CODEC_MARCH" in out.stderr and "not a -march target" in out.stderr
