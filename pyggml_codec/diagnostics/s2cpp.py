"""Stage-by-stage comparison with the C++ engine s2.cpp, built from a source tree the user has.

The harness (``s2cpp_harness/``: a CMake project of this package) compiles s2.cpp's own codec
source and the ggml of that tree, composes s2.cpp's graph builders the way its CPU decode and
encode do with every stage kept, and checks itself against s2.cpp's ``AudioCodec::decode`` /
``encode`` (bit for bit). :func:`build_harness` builds it; :func:`run_harness` runs it and reads
its stages as a dump (``io/dumps.py`` layout); :func:`compare_with_s2cpp` runs both engines on
the same input and returns the :class:`~.compare.Report` (first differing stage first).

The ISA key (:func:`isa_key`) names the summation order of ggml's F16 dot product, which is what
bit-exactness depends on: "avx512fp16" (32 half-precision lanes: a ggml built for AVX512-FP16),
"avx512" (16 float lanes) or "avx2" (8 float lanes, with FMA and F16C). The harness's ``info``
measures the half-precision sums (``f16_dot_half``) as the binding does; ggml does not report them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..backend.buildinfo import isa_key  # noqa: F401  (the golden-set key, re-exported)
from ..errors import CodecError
from ..io.dumps import Dump, decode_dump, encode_dump
from ..model.gguf_file import ModelFile
from .compare import Report, StageResult, compare, compare_stage

HARNESS_SOURCE = Path(__file__).with_name("s2cpp_harness")
REQUIRED_FILES = ("src/s2_codec.cpp", "src/s2_log.cpp", "src/s2_model.cpp", "include/s2_codec.h", "ggml/CMakeLists.txt")
EXACT = {"max_abs": 0.0, "rel_rms": 0.0, "agreement": 1.0}  # bit for bit
# The harness's channels-last float stages come as numpy (T, C); the dumps hold (C, T).
_AS_IS = ("codes", "audio")


class S2cppError(CodecError, RuntimeError):
    """The s2.cpp comparison cannot run: not an s2.cpp tree, a failed build, a model the C++
    engine rejects, or a harness that does not reproduce its s2.cpp's own output."""


def check_tree(s2cpp_dir: str | os.PathLike) -> Path:
    """``s2cpp_dir`` as an absolute path, or S2cppError naming what an s2.cpp tree lacks."""
    root = Path(s2cpp_dir).expanduser().resolve()
    if not root.is_dir():
        raise S2cppError(f"{root}: not a directory (give the root of an s2.cpp checkout)")
    missing = [f for f in REQUIRED_FILES if not (root / f).is_file()]
    if missing:
        hint = " (its ggml submodule is not checked out: git submodule update --init)" if missing == [
            "ggml/CMakeLists.txt"] else ""
        raise S2cppError(f"{root}: not an s2.cpp source tree: missing {', '.join(missing)}{hint}")
    return root


def _tree_key(root: Path, cmake_args: Sequence[str]) -> str:
    h = hashlib.sha256()
    for name in ("src/s2_codec.cpp", "ggml/CMakeLists.txt"):
        h.update((root / name).read_bytes())
    h.update(str(root).encode())
    h.update("\0".join(cmake_args).encode())
    for f in sorted(HARNESS_SOURCE.iterdir()):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def default_build_dir(root: Path, cmake_args: Sequence[str]) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pyggml_codec" / "s2cpp_harness"
    return cache / _tree_key(root, cmake_args)


def build_harness(s2cpp_dir: str | os.PathLike, build_dir: str | os.PathLike | None = None,
                  cmake_args: Sequence[str] = (), jobs: int | None = None, timeout: float = 1800) -> Path:
    """Configure and build the harness against ``s2cpp_dir``; return the executable.

    ``cmake_args`` go to the configure step (e.g. ``-DGGML_NATIVE=OFF -DGGML_AVX2=ON`` for an
    AVX2 build). Builds are cached per tree, arguments and harness version (default under
    ``~/.cache/pyggml_codec``); an existing executable is reused.
    """
    root = check_tree(s2cpp_dir)
    if shutil.which("cmake") is None:
        raise S2cppError("cmake is not on PATH (the harness is a CMake project)")
    build = Path(build_dir) if build_dir is not None else default_build_dir(root, cmake_args)
    exe = build / "s2cpp_dump"
    if exe.is_file():
        return exe
    build.mkdir(parents=True, exist_ok=True)
    log = build / "build.log"
    steps = [["cmake", "-S", str(HARNESS_SOURCE), "-B", str(build), f"-DS2CPP_DIR={root}", *cmake_args],
             ["cmake", "--build", str(build), "-j", str(jobs or os.cpu_count() or 1)]]
    with open(log, "w") as out:
        for cmd in steps:
            try:
                rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                raise S2cppError(f"building the s2.cpp harness took over {timeout:.0f} s (log: {log})") from None
            if rc != 0:
                out.flush()
                tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
                raise S2cppError(f"building the s2.cpp harness failed ({' '.join(cmd[:2])}, exit {rc}; log: {log}):\n{tail}")
    if not exe.is_file():
        raise S2cppError(f"the harness build finished without {exe}")
    return exe


def _run(exe: Path, args: list[str], timeout: float) -> str:
    try:
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise S2cppError(f"s2.cpp ran over {timeout:.0f} s on {' '.join(args[:2])}") from None
    except OSError as exc:
        raise S2cppError(f"cannot run the harness {exe}: {exc}") from None
    if proc.returncode < 0:
        raise S2cppError(f"s2.cpp aborted (signal {-proc.returncode}) on {' '.join(args[:2])}; its last output:\n"
                         f"{proc.stderr[-2000:]}")
    if proc.returncode != 0:
        raise S2cppError(f"s2.cpp harness failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def harness_info(exe: str | os.PathLike) -> dict[str, Any]:
    """What the harness's ggml was built with: avx, avx2, avx512, f16c, fma, llamafile, ggml_commit,
    and f16_dot_half (measured: its F16 dot product adds in half precision)."""
    return json.loads(_run(Path(exe), ["info"], 60))


def check_model_for_s2cpp(model: str | os.PathLike) -> None:
    """S2cppError for a file the C++ engine cannot run: an F32 file aborts in ggml's im2col
    (``ggml_conv_1d`` asks for F16 columns against the file's conv kernels)."""
    mf = ModelFile.open(model)
    kinds = {t.type_name for name, t in mf.tensors.items() if name.endswith(".conv.weight") and len(t.shape) == 3}
    if "F32" in kinds:
        raise S2cppError(f"{model}: F32 conv weights; s2.cpp aborts on such a file (ggml_conv_1d builds F16 "
                         "im2col columns, and ggml's im2col asserts on an F32 kernel): compare an F16 file")


def _to_dump_layout(name: str, arr: np.ndarray) -> np.ndarray:
    if name in _AS_IS or name.endswith(".codes") or arr.ndim != 2:
        return arr
    return np.ascontiguousarray(arr.T)


def run_harness(exe: str | os.PathLike, kind: str, model: str | os.PathLike, data: np.ndarray,
                threads: int = 1, timeout: float = 1800) -> Dump:
    """Run the harness on ``data`` (codes (K, T) int32 for "decode", mono float32 samples for
    "encode"); return its stages in the dump layout, with the build's features in ``meta``."""
    if kind not in ("decode", "encode"):
        raise ValueError(f"kind must be 'decode' or 'encode', got {kind!r}")
    arr = np.ascontiguousarray(data, np.int32 if kind == "decode" else np.float32)
    with tempfile.TemporaryDirectory(prefix="s2cpp_dump_") as tmp:
        src = Path(tmp) / "input.npy"
        np.save(src, arr)
        out = Path(tmp) / "out"
        out.mkdir()
        _run(Path(exe), [kind, str(model), str(src), str(out), str(int(threads))], timeout)
        meta = json.loads((out / "stages.json").read_text())
        stages = {n: _to_dump_layout(n, np.load(out / f"{n}.npy")) for n in meta["stages"]}
    if not meta.get("self_check"):
        raise S2cppError("the harness's composed stages do not reproduce s2.cpp's own output")
    meta["producer"] = "s2.cpp"
    return Dump(stages, meta)


def compare_with_s2cpp(codec, kind: str, data: np.ndarray, s2cpp: Dump | None = None, *,
                       exe: str | os.PathLike | None = None, model: str | os.PathLike | None = None,
                       threads: int | None = None, tolerances: Mapping[str, Any] | None = None) -> Report:
    """Run ``codec`` (this library) and s2.cpp on the same codes or audio and compare every stage
    with s2.cpp as the reference (default tolerance: bit for bit, :data:`EXACT`).

    ``s2cpp``: s2.cpp's dump when already at hand (a golden file); else ``exe`` and ``model``
    run the harness. Encode runs with ``pad_to="frame_length"``, as s2.cpp pads.
    """
    if s2cpp is None:
        if exe is None or model is None:
            raise ValueError("give either s2.cpp's dump or the harness executable and the model file")
        check_model_for_s2cpp(model)
        s2cpp = run_harness(exe, kind, model, data, threads or codec.n_threads)
    ours = our_stages(codec, kind, data)
    report = compare(dict(s2cpp.stages), ours, tolerances or EXACT)
    report.a, report.b = "s2.cpp", f"pyggml_codec ({codec.precision})"
    return report


# --------------------------------------------------------------------------- golden dumps

GOLDEN_FULL_LIMIT = 4096  # stages up to this many elements are kept whole, larger ones as a digest
GOLDEN_WHOLE = ("codes", "audio")  # always whole: the inputs of decode and encode, and the output


def _digest(arr: np.ndarray) -> str:
    arr = np.ascontiguousarray(arr)
    return f"{arr.dtype.str}:{'x'.join(map(str, arr.shape))}:{hashlib.sha256(arr.tobytes()).hexdigest()}"


def save_golden(dump: Dump, path: str | os.PathLike, meta: Mapping[str, Any] | None = None,
                full_limit: int = GOLDEN_FULL_LIMIT) -> Path:
    """Write s2.cpp's stages compactly: small stages whole, large ones as a SHA-256 digest of
    their bytes (dtype, shape, hash) with their RMS, so a bit-exact check needs no large file."""
    entries: dict[str, np.ndarray] = {}
    digests: dict[str, dict[str, Any]] = {}
    for name, arr in dump.stages.items():
        if arr.size <= full_limit or name in GOLDEN_WHOLE:
            entries[name] = np.ascontiguousarray(arr)
        else:
            digests[name] = {"digest": _digest(arr), "rms": float(np.sqrt(np.mean(np.square(arr, dtype=np.float64))))}
    info = {**dump.meta, **(meta or {}), "order": list(dump.stages), "digests": digests}
    entries["__golden__"] = np.array(json.dumps(info, allow_nan=False, default=str))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez_compressed(f, **entries)
    return path


def load_golden(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(whole stages, metadata with ``order`` and ``digests``) of a golden file."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["__golden__"][()]))
            return {n: z[n] for n in z.files if n != "__golden__"}, meta
    except (OSError, ValueError, KeyError) as exc:
        raise S2cppError(f"{path}: unreadable golden s2.cpp dump ({exc})") from None


def compare_golden(path: str | os.PathLike, ours: Mapping[str, np.ndarray]) -> Report:
    """Compare this library's stages with a golden s2.cpp dump, bit for bit: whole stages by
    value (the report shows how far), digested ones by hash (and RMS, when they differ)."""
    whole, meta = load_golden(path)
    results = []
    for name in meta["order"]:
        if name not in ours:
            continue
        if name in whole:
            results.append(compare_stage(name, whole[name], ours[name], dict(EXACT)))
            continue
        d = meta["digests"][name]
        arr = np.ascontiguousarray(ours[name])
        rms = float(np.sqrt(np.mean(np.square(arr, dtype=np.float64))))
        same = _digest(arr) == d["digest"]
        shape = tuple(int(n) for n in d["digest"].split(":")[1].split("x"))
        violations = [] if same else [f"bits differ (digest; rms {d['rms']:.6e} vs {rms:.6e})"]
        metrics = {"max_abs": 0.0, "rel_rms": 0.0} if same else {}
        results.append(StageResult(name, "digest", shape, tuple(arr.shape), metrics, dict(EXACT), violations))
    missing = [n for n in meta["order"] if n not in ours]
    return Report(f"s2.cpp golden {Path(path).name}", "pyggml_codec", "dump", results, only_in_a=missing,
                  only_in_b=[n for n in ours if n not in meta["order"]])


def our_stages(codec, kind: str, data: np.ndarray) -> dict[str, np.ndarray]:
    """This library's stages for ``data`` in the dump layout (encode as s2.cpp pads)."""
    if kind == "decode":
        codes = np.asarray(data, np.int32)
        audio, stages = codec.decode_stages(codes)
        return decode_dump(stages, codes, audio, codec.config)
    x = np.asarray(data, np.float32)
    result = codec.encode_stages(x, codec.sample_rate, pad_to="frame_length")
    return encode_dump(result.stages, x, result.codes, codec.config, "frame_length")
