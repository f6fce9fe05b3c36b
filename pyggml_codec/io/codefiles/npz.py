"""This project's self-describing container, ``.npz``."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .base import (MAX_FILE_BYTES, CodeFile, CodeFileFormat, as_codes, check_whole_number,
                   encode_transcript)
from .npy import codes_from_array, npy_bytes, parse_npy
from ...errors import CodeFileError

_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


@dataclass(eq=False)  # equal when their bytes are (CodeFileFormat.__eq__)
class NpzFile(CodeFileFormat):
    """This project's self-describing container: a zip of ``.npy`` members (see :attr:`MEMBERS`),
    readable with plain ``np.load(path, allow_pickle=False)``.

    int32 codes plus the format version, n_codebooks and, when known, the codebook sizes, sample
    rate, samples per frame, original length in samples, padding policy, the model file's
    sha256, library version and transcript. The reader checks them against each other and
    refuses unknown members. Written deterministically (fixed zip timestamps).
    """

    EXTENSION: ClassVar[str] = ".npz"
    VERSION: ClassVar[int] = 1
    # member -> (kind, required), in the order written; kinds: "codes", "int", "str", "ints"
    MEMBERS: ClassVar[dict[str, tuple[str, bool]]] = {
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
    META: ClassVar[tuple[str, ...]] = ("codebook_sizes", "samples_per_frame", "pad_to", "model_sha256",
                                       "library_version")  # the optional members CodeFile keeps in meta
    codes: np.ndarray
    sample_rate: int | None = None
    n_samples: int | None = None
    transcript: str | None = None
    codebook_sizes: tuple[int, ...] | None = None
    samples_per_frame: int | None = None
    pad_to: str | None = None
    model_sha256: str | None = None
    library_version: str | None = None

    def __post_init__(self) -> None:
        self.codes = as_codes(self.codes)
        for name in ("sample_rate", "n_samples", "samples_per_frame"):
            if getattr(self, name) is not None:
                setattr(self, name, check_whole_number(name, getattr(self, name)))
        for name in ("pad_to", "model_sha256", "library_version"):
            if getattr(self, name) is not None:
                setattr(self, name, str(getattr(self, name)))
        if self.codebook_sizes is not None:
            self.codebook_sizes = tuple(int(v) for v in self.codebook_sizes)
        if self.transcript is not None:
            encode_transcript(self.transcript)
        self._check_consistency()

    def _check_consistency(self) -> None:
        n_cb, n_frames = self.codes.shape
        sizes = self.codebook_sizes
        if sizes is not None and (len(sizes) != n_cb or min(sizes) < 1):
            raise CodeFileError(f"codebook_sizes {list(sizes)} do not fit {n_cb} codebooks")
        for name in ("sample_rate", "samples_per_frame"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise CodeFileError(f"{name} = {getattr(self, name)} is impossible")
        n, spf = self.n_samples, self.samples_per_frame
        if n is not None and (n < 1 or (spf is not None and not (n_frames - 1) * spf < n <= n_frames * spf)):
            raise CodeFileError(f"n_samples = {n} does not fit {n_frames} frames of {spf} samples")
        if self.pad_to is not None and self.pad_to not in ("code_frame", "frame_length"):
            raise CodeFileError(f"pad_to = {self.pad_to!r} is not 'code_frame' or 'frame_length'")

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name, arr in self._entries().items():
                info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, npy_bytes(arr))
        return buf.getvalue()

    def _entries(self) -> dict[str, np.ndarray]:
        fixed = {"format_version": self.VERSION, "n_codebooks": self.codes.shape[0]}
        out = {}
        for name, (kind, _) in self.MEMBERS.items():
            value = fixed[name] if name in fixed else getattr(self, name)
            if value is None:
                continue
            if kind == "str":
                out[name] = np.array(value)
            elif kind == "ints":
                out[name] = np.asarray(value, dtype=np.int64)
            elif kind == "int":
                out[name] = np.array(value, dtype=np.int64)
            else:
                out[name] = value
        return out

    @classmethod
    def from_bytes(cls, data: bytes) -> NpzFile:
        values = _npz_members(data, cls.MEMBERS)
        for name, (_, required) in cls.MEMBERS.items():
            if required and name not in values:
                raise CodeFileError(f"missing member {name!r}")
        if values["format_version"] != cls.VERSION:
            raise CodeFileError(f"unsupported container version {values['format_version']} "
                                f"(this library reads {cls.VERSION})")
        del values["format_version"]
        n_cb = values.pop("n_codebooks")
        if n_cb != values["codes"].shape[0]:
            raise CodeFileError(f"n_codebooks = {n_cb} but the codes have {values['codes'].shape[0]} rows")
        return cls(**values)

    @classmethod
    def from_code_file(cls, cf: CodeFile) -> NpzFile:
        return cls(cf.codes, sample_rate=cf.sample_rate, n_samples=cf.n_samples, transcript=cf.transcript,
                   **{name: cf.meta.get(name) for name in cls.META})

    def to_code_file(self) -> CodeFile:
        meta: dict[str, Any] = {name: getattr(self, name) for name in self.META if getattr(self, name) is not None}
        meta["format_version"] = self.VERSION
        return CodeFile(self.codes, sample_rate=self.sample_rate, n_samples=self.n_samples,
                        transcript=self.transcript, meta=meta)


def _npz_value(name: str, kind: str, arr: np.ndarray) -> Any:
    if kind == "codes":
        return codes_from_array(arr, "codes")
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


def _npz_members(data: bytes, members: dict[str, tuple[str, bool]]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                name = info.filename.removesuffix(".npy")
                if name not in members or not info.filename.endswith(".npy"):
                    raise CodeFileError(f"unexpected member {info.filename!r}")
                if name in values:
                    raise CodeFileError(f"duplicate member {info.filename!r}")
                if info.file_size > MAX_FILE_BYTES:
                    raise CodeFileError(f"member {info.filename!r} claims {info.file_size} bytes")
                values[name] = _npz_value(name, members[name][0], parse_npy(zf.read(info), name))
    except CodeFileError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError,
            OverflowError, struct.error, KeyError, UnicodeError, OSError) as exc:
        raise CodeFileError(f"corrupt .npz container ({type(exc).__name__}: {exc})") from None
    return values
