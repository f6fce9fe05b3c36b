"""The upstream fish-speech ``.npy`` layout, and the ``.npy`` parsing the ``.npz`` container reuses."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import CodeFile, CodeFileFormat, as_codes
from ...errors import CodeFileError


@dataclass(eq=False)  # equal when their bytes are (CodeFileFormat.__eq__)
class NpyFile(CodeFileFormat):
    """The upstream fish-speech layout: an int64 ``(n_codebooks, T)`` array, nothing else.

    Reading accepts int32 or int64 (either byte order, C or Fortran order, .npy format 1.0 or
    2.0). The layout has no version of its own: ``VERSION`` is that of the .npy format written.
    """

    EXTENSION: ClassVar[str] = ".npy"
    VERSION: ClassVar[int] = 1
    codes: np.ndarray

    def __post_init__(self) -> None:
        self.codes = as_codes(self.codes)

    def to_bytes(self) -> bytes:
        return npy_bytes(self.codes.astype(np.int64))

    @classmethod
    def from_bytes(cls, data: bytes) -> NpyFile:
        return cls(codes_from_array(parse_npy(data, "codes")))

    @classmethod
    def from_code_file(cls, cf: CodeFile) -> NpyFile:
        return cls(cf.codes)

    def to_code_file(self) -> CodeFile:
        return CodeFile(self.codes)


def parse_npy(buf: bytes, what: str = "array") -> np.ndarray:
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


def npy_bytes(arr: np.ndarray) -> bytes:
    """``arr`` as ``.npy`` file content (no pickles)."""
    out = io.BytesIO()
    np.save(out, arr, allow_pickle=False)
    return out.getvalue()


def codes_from_array(arr: np.ndarray, what: str = "codes") -> np.ndarray:
    """A parsed int32 or int64 array (either byte order) as codes; CodeFileError naming ``what``."""
    if arr.dtype.kind not in "iu" or arr.dtype.itemsize not in (4, 8) or arr.dtype.kind == "u":
        raise CodeFileError(f"{what}: dtype {arr.dtype} is not int32 or int64")
    if arr.ndim != 2:
        raise CodeFileError(f"{what}: shape {arr.shape} is not 2-D (n_codebooks, T)")
    return as_codes(arr.astype(arr.dtype.newbyteorder("=")))
