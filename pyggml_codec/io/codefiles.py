"""Code files: the upstream ``.npy``, the C++ engine's ``.s2voice`` and this project's ``.npz``.

Codes are ``(n_codebooks, T)`` integers, codebook-major (``codes[cb, t]``). Each format
is chosen by its extension; :func:`read_codes` returns a :class:`CodeFile` and
:func:`write_codes` writes one atomically (temp file in the same folder, then
``os.replace``). Every reader checks each length field against the file size before it
allocates anything, and every problem raises :class:`CodeFileError` with the reason.

``.npy``  upstream fish-speech layout: an int64 ``(n_codebooks, T)`` array, nothing else.
          Reading accepts int32 or int64 (either byte order, C or Fortran order).

``.s2voice``  the C++ engine's format, little-endian, no padding, no checksum::

      offset size  field
      0      8     magic b"S2VOICE\\0"
      8      4     u32 version (1)
      12     4     i32 num_codebooks
      16     4     i32 T (frames)
      20     4     i32 sample_rate
      24     4     i32 codebook_size
      28     8     u64 transcript_len  (UTF-8 bytes + 1: the NUL terminator counts)
      36     8     u64 codes_size      (bytes: num_codebooks * T * 4)
      44     ...   transcript bytes, then NUL
      ...    ...   int32 codes, codebook-major; the file ends here

``.npz``  the self-describing container (a zip of ``.npy`` members, see :data:`NPZ_MEMBERS`):
          int32 codes plus format version, original length in samples, sample rate,
          padding policy, the model file's sha256, library version, n_codebooks, codebook
          sizes and samples per frame. Written deterministically (fixed zip timestamps).
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .fileio import write_bytes_atomic
from ..errors import CodeFileError

EXTENSIONS = (".npz", ".npy", ".s2voice")
S2VOICE_MAGIC = b"S2VOICE\0"
S2VOICE_VERSION = 1
S2VOICE_HEADER = struct.Struct("<8sIiiiiQQ")  # 44 bytes, see the module docstring
NPZ_FORMAT_VERSION = 1
# member -> (kind, required); kinds: "codes", "int", "str", "ints"
NPZ_MEMBERS: dict[str, tuple[str, bool]] = {
    "format_version": ("int", True),
    "codes": ("codes", True),
    "n_codebooks": ("int", True),
    "codebook_sizes": ("ints", False),
    "sample_rate": ("int", False),
    "samples_per_frame": ("int", False),
    "n_samples": ("int", False),
    "pad_to": ("str", False),
    "model_sha256": ("str", False),
    "library_version": ("str", False),
    "transcript": ("str", False),
}
MAX_FILE_BYTES = 1 << 30  # no code file is near this: 1 hour of S2 codes is 3 MB
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_INT32 = np.iinfo(np.int32)


@dataclass
class CodeFile:
    """Codes and what a file knows about them.

    ``codes``: int32 ``(n_codebooks, T)``, C-contiguous (any integer input is converted;
    values must fit in int32). ``sample_rate``: Hz, when the file says. ``n_samples``: the
    original audio length before padding, when known (then decode output can be trimmed).
    ``meta``: the rest (``.npz``: pad_to, model_sha256, library_version, codebook_sizes,
    samples_per_frame, format_version; ``.s2voice``: version, codebook_size).
    """

    codes: np.ndarray
    sample_rate: int | None = None
    n_samples: int | None = None
    transcript: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.codes = _as_codes(self.codes)

    @property
    def n_codebooks(self) -> int:
        return int(self.codes.shape[0])

    @property
    def n_frames(self) -> int:
        return int(self.codes.shape[1])


def _as_codes(codes: Any) -> np.ndarray:
    arr = np.asarray(codes)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise CodeFileError(f"codes must be integers, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise CodeFileError(f"codes must be 2-D (n_codebooks, T), got shape {arr.shape}")
    if arr.shape[0] < 1:
        raise CodeFileError("codes have no codebooks")
    if arr.size and (int(arr.min()) < _INT32.min or int(arr.max()) > _INT32.max):
        raise CodeFileError("codes do not fit in int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


def format_of(path: str | os.PathLike) -> str:
    """The code-file kind an extension names: "npz", "npy" or "s2voice"; CodeFileError otherwise."""
    ext = Path(path).suffix.lower()
    if ext not in EXTENSIONS:
        raise CodeFileError(f"{path}: unknown code file extension {ext or '(none)'!r}; use one of {', '.join(EXTENSIONS)}")
    return ext[1:]


def read_codes(path: str | os.PathLike) -> CodeFile:
    """Read a code file, the format chosen by extension. Missing file: FileNotFoundError."""
    kind = format_of(path)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such code file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise CodeFileError(f"{path}: {size} bytes is too large for a code file")
    data = path.read_bytes()
    try:
        return _READERS[kind](data)
    except CodeFileError as exc:
        raise CodeFileError(f"{path}: {exc}") from None


def write_codes(path: str | os.PathLike, cf: CodeFile) -> Path:
    """Write ``cf`` atomically in the format the extension names; returns the path."""
    kind = format_of(path)
    return write_bytes_atomic(path, _WRITERS[kind](cf))


def to_bytes(cf: CodeFile, kind: str) -> bytes:
    """The file content ``write_codes`` would write for ``kind`` ("npz", "npy", "s2voice")."""
    if kind not in _WRITERS:
        raise CodeFileError(f"unknown code file kind {kind!r}")
    return _WRITERS[kind](cf)


def from_bytes(data: bytes, kind: str) -> CodeFile:
    """Parse file content of ``kind``; CodeFileError on anything malformed."""
    if kind not in _READERS:
        raise CodeFileError(f"unknown code file kind {kind!r}")
    return _READERS[kind](bytes(data))


# --------------------------------------------------------------------------- .npy


def _parse_npy(buf: bytes, what: str = "array") -> np.ndarray:
    """A ``.npy`` byte string as an array, checking the header against the data size first."""
    f = io.BytesIO(buf)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise CodeFileError(f"{what}: unsupported .npy version {version}")
    except CodeFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy's header parser raises many kinds on hostile input
        raise CodeFileError(f"{what}: not a valid .npy header ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise CodeFileError(f"{what}: unsupported dtype {dtype}")
    if any(int(d) < 0 for d in shape):
        raise CodeFileError(f"{what}: negative dimension in shape {shape}")
    count = 1
    for d in shape:
        count *= int(d)
    offset = f.tell()
    need = count * dtype.itemsize
    if need != len(buf) - offset:
        raise CodeFileError(f"{what}: header says {need} data bytes, the file holds {len(buf) - offset}")
    flat = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order="F" if fortran else "C")


def _npy_bytes(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, arr, allow_pickle=False)
    return out.getvalue()


def _codes_from_array(arr: np.ndarray, what: str = "codes") -> np.ndarray:
    if arr.dtype.kind not in "iu" or arr.dtype.itemsize not in (4, 8) or arr.dtype.kind == "u":
        raise CodeFileError(f"{what}: dtype {arr.dtype} is not int32 or int64")
    if arr.ndim != 2:
        raise CodeFileError(f"{what}: shape {arr.shape} is not 2-D (n_codebooks, T)")
    return _as_codes(arr.astype(arr.dtype.newbyteorder("=")))


def _read_npy(data: bytes) -> CodeFile:
    return CodeFile(_codes_from_array(_parse_npy(data, "codes")))


def _write_npy(cf: CodeFile) -> bytes:
    return _npy_bytes(cf.codes.astype(np.int64))


# --------------------------------------------------------------------------- .s2voice


def _read_s2voice(data: bytes) -> CodeFile:
    if len(data) < S2VOICE_HEADER.size:
        raise CodeFileError(f"{len(data)} bytes is too short for the {S2VOICE_HEADER.size}-byte s2voice header")
    magic, version, n_cb, n_frames, rate, cb_size, text_len, codes_size = S2VOICE_HEADER.unpack_from(data)
    if magic != S2VOICE_MAGIC:
        raise CodeFileError(f"not an s2voice file (magic {magic!r})")
    if version != S2VOICE_VERSION:
        raise CodeFileError(f"unsupported s2voice version {version} (this library reads {S2VOICE_VERSION})")
    for name, value in (("num_codebooks", n_cb), ("sample_rate", rate), ("codebook_size", cb_size)):
        if value < 1:
            raise CodeFileError(f"s2voice {name} = {value} is impossible")
    if n_frames < 0:
        raise CodeFileError(f"s2voice T = {n_frames} is impossible")
    if codes_size != n_cb * n_frames * 4:
        raise CodeFileError(f"s2voice codes_size = {codes_size} bytes, but {n_cb} x {n_frames} int32 codes take {n_cb * n_frames * 4}")
    if text_len < 1:
        raise CodeFileError("s2voice transcript_len = 0 (the NUL terminator is counted, so it is at least 1)")
    expected = S2VOICE_HEADER.size + text_len + codes_size
    if expected != len(data):
        what = "truncated" if expected > len(data) else f"{len(data) - expected} trailing bytes"
        raise CodeFileError(f"s2voice header implies {expected} bytes, the file has {len(data)} ({what})")
    start = S2VOICE_HEADER.size
    text = data[start:start + text_len]
    if text[-1] != 0:
        raise CodeFileError("s2voice transcript is not NUL-terminated")
    if 0 in text[:-1]:
        raise CodeFileError("s2voice transcript contains a NUL byte before its end")
    try:
        transcript = text[:-1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodeFileError(f"s2voice transcript is not UTF-8 ({exc})") from None
    codes = np.frombuffer(data, dtype="<i4", count=n_cb * n_frames, offset=start + text_len).reshape(n_cb, n_frames)
    return CodeFile(codes, sample_rate=rate, transcript=transcript,
                    meta={"version": version, "codebook_size": cb_size})


def _s2voice_codebook_size(cf: CodeFile) -> int:
    if cf.meta.get("codebook_size") is not None:
        return int(cf.meta["codebook_size"])
    if cf.meta.get("codebook_sizes"):
        return int(max(cf.meta["codebook_sizes"]))
    raise CodeFileError("an s2voice file needs a codebook_size (meta['codebook_size'] or meta['codebook_sizes'])")


def _write_s2voice(cf: CodeFile) -> bytes:
    text = (cf.transcript or "").encode("utf-8")
    if b"\0" in text:
        raise CodeFileError("an s2voice transcript cannot contain NUL characters")
    if not cf.sample_rate or not 0 < int(cf.sample_rate) <= _INT32.max:
        raise CodeFileError(f"an s2voice file needs a positive int32 sample_rate, got {cf.sample_rate!r}")
    cb_size = _s2voice_codebook_size(cf)
    n_cb, n_frames = cf.codes.shape
    if not 0 < cb_size <= _INT32.max or n_frames > _INT32.max:
        raise CodeFileError(f"s2voice fields out of int32 range (codebook_size {cb_size}, T {n_frames})")
    header = S2VOICE_HEADER.pack(S2VOICE_MAGIC, S2VOICE_VERSION, n_cb, n_frames, int(cf.sample_rate), cb_size,
                                 len(text) + 1, n_cb * n_frames * 4)
    return header + text + b"\0" + cf.codes.astype("<i4").tobytes()


# --------------------------------------------------------------------------- .npz


def _npz_value(name: str, arr: np.ndarray) -> Any:
    kind = NPZ_MEMBERS[name][0]
    if kind == "codes":
        return _codes_from_array(arr, "codes")
    if kind == "str":
        if arr.ndim != 0 or arr.dtype.kind != "U":
            raise CodeFileError(f"member {name!r} must be a 0-d string, got {arr.dtype} {arr.shape}")
        return str(arr.item())
    if arr.dtype.kind not in "iu":
        raise CodeFileError(f"member {name!r} must be integer, got {arr.dtype}")
    if kind == "ints":
        if arr.ndim != 1:
            raise CodeFileError(f"member {name!r} must be 1-D, got shape {arr.shape}")
        return tuple(int(v) for v in arr)
    if arr.ndim != 0:
        raise CodeFileError(f"member {name!r} must be a scalar, got shape {arr.shape}")
    return int(arr.item())


def _npz_members(data: bytes) -> dict[str, Any]:
    values: dict[str, Any] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                name = info.filename.removesuffix(".npy")
                if name not in NPZ_MEMBERS or not info.filename.endswith(".npy"):
                    raise CodeFileError(f"unexpected member {info.filename!r}")
                if name in values:
                    raise CodeFileError(f"duplicate member {info.filename!r}")
                if info.file_size > MAX_FILE_BYTES:
                    raise CodeFileError(f"member {info.filename!r} claims {info.file_size} bytes")
                values[name] = _npz_value(name, _parse_npy(zf.read(info), name))
    except CodeFileError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError,
            OverflowError, struct.error, KeyError, UnicodeError, OSError) as exc:
        raise CodeFileError(f"corrupt .npz container ({type(exc).__name__}: {exc})") from None
    return values


def _read_npz(data: bytes) -> CodeFile:
    values = _npz_members(data)
    for name, (_, required) in NPZ_MEMBERS.items():
        if required and name not in values:
            raise CodeFileError(f"missing member {name!r}")
    if values["format_version"] != NPZ_FORMAT_VERSION:
        raise CodeFileError(f"unsupported container version {values['format_version']} (this library reads {NPZ_FORMAT_VERSION})")
    codes = values.pop("codes")
    _check_npz_consistency(codes, values)
    del values["n_codebooks"]  # the codes' row count says it
    return CodeFile(codes, sample_rate=values.pop("sample_rate", None), n_samples=values.pop("n_samples", None),
                    transcript=values.pop("transcript", None), meta=values)


def _check_npz_consistency(codes: np.ndarray, v: dict[str, Any]) -> None:
    n_cb, n_frames = codes.shape
    if v["n_codebooks"] != n_cb:
        raise CodeFileError(f"n_codebooks = {v['n_codebooks']} but the codes have {n_cb} rows")
    sizes = v.get("codebook_sizes")
    if sizes is not None and (len(sizes) != n_cb or min(sizes) < 1):
        raise CodeFileError(f"codebook_sizes {list(sizes)} do not fit {n_cb} codebooks")
    for name in ("sample_rate", "samples_per_frame"):
        if name in v and v[name] < 1:
            raise CodeFileError(f"{name} = {v[name]} is impossible")
    n = v.get("n_samples")
    if n is not None:
        spf = v.get("samples_per_frame")
        if n < 1 or (spf is not None and not (n_frames - 1) * spf < n <= n_frames * spf):
            raise CodeFileError(f"n_samples = {n} does not fit {n_frames} frames of {spf} samples")
    if "pad_to" in v and v["pad_to"] not in ("code_frame", "frame_length"):
        raise CodeFileError(f"pad_to = {v['pad_to']!r} is not 'code_frame' or 'frame_length'")


def _npz_entries(cf: CodeFile) -> dict[str, np.ndarray]:
    m = cf.meta
    values: dict[str, Any] = {
        "format_version": NPZ_FORMAT_VERSION, "codes": cf.codes, "n_codebooks": cf.n_codebooks,
        "codebook_sizes": m.get("codebook_sizes"), "sample_rate": cf.sample_rate,
        "samples_per_frame": m.get("samples_per_frame"), "n_samples": cf.n_samples, "pad_to": m.get("pad_to"),
        "model_sha256": m.get("model_sha256"), "library_version": m.get("library_version"),
        "transcript": cf.transcript,
    }
    out = {}
    for name, value in values.items():
        if value is None:
            continue
        kind = NPZ_MEMBERS[name][0]
        if kind == "str":
            out[name] = np.array(str(value))
        elif kind == "ints":
            out[name] = np.asarray([int(v) for v in value], dtype=np.int64)
        elif kind == "int":
            out[name] = np.array(int(value), dtype=np.int64)
        else:
            out[name] = value
    return out


def _write_npz(cf: CodeFile) -> bytes:
    entries = _npz_entries(cf)
    _check_npz_consistency(cf.codes, {k: _npz_value(k, v) for k, v in entries.items() if k != "codes"})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in entries.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, _npy_bytes(arr))
    return buf.getvalue()


_READERS = {"npy": _read_npy, "s2voice": _read_s2voice, "npz": _read_npz}
_WRITERS = {"npy": _write_npy, "s2voice": _write_s2voice, "npz": _write_npz}

