"""Opening GGUF files defensively.

The PyPI ``gguf`` reader trusts the header: a huge tensor or key count, a huge string
length or a truncated file make it raise bare ``IndexError``/``ValueError`` or read past
the data. This module checks the fixed header against the file size first, wraps every
reader failure in :class:`ModelFileError` with the reason, and checks that each tensor's
data lies inside the file.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# Smallest possible encodings: a key-value pair is a u64 key length, one key byte, a u32
# type and at least one value byte; a tensor info is a u64 name length, one name byte, a
# u32 n_dims, one u64 dim, a u32 type and a u64 offset.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8
# ggml types this library can load (others are named in the error).
FLOAT_TYPES = {0: "F32", 1: "F16"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: ``ne`` is ggml order, ``data`` a read-only memory map."""

    name: str
    ggml_type: int
    ne: tuple[int, ...]
    data: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy (= PyTorch) order."""
        return tuple(reversed(self.ne))

    @property
    def type_name(self) -> str:
        return FLOAT_TYPES.get(self.ggml_type, f"type {self.ggml_type}")

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True)
class MetaValue:
    """A metadata value with its GGUF type name (e.g. ``UINT32``, ``ARRAY[INT32]``)."""

    value: Any
    type_name: str


class ModelFile:
    """The metadata and tensor table of a GGUF file, checked for consistency."""

    def __init__(self, reader: Any, source: str):
        self.source = source
        self.reader = reader
        self.metadata: dict[str, MetaValue] = _read_metadata(reader, source)
        self.tensors: dict[str, TensorInfo] = _read_tensors(reader, source)

    @classmethod
    def open(cls, path: str | os.PathLike) -> "ModelFile":
        path = Path(path)
        if not path.is_file():
            raise ModelFileError(f"{path}: no such model file")
        _check_header(path)
        return cls(_open_reader(path), str(path))

    @classmethod
    def from_reader(cls, reader: Any) -> "ModelFile":
        """Wrap a ``gguf.GGUFReader`` that the host application already opened."""
        if not hasattr(reader, "fields") or not hasattr(reader, "tensors"):
            raise ModelFileError(f"expected a gguf.GGUFReader, got {type(reader).__name__}")
        return cls(reader, str(getattr(reader, "path", "<reader>")))

    @property
    def architecture(self) -> str:
        meta = self.metadata.get("general.architecture")
        if meta is None:
            raise ModelFileError(f"{self.source}: no general.architecture key")
        if meta.type_name != "STRING":
            raise ModelFileError(f"{self.source}: general.architecture is {meta.type_name}, expected STRING")
        return meta.value


def _check_header(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24:
        raise ModelFileError(f"{path}: {size} bytes is too short for a GGUF header")
    if head[:4] != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (magic {head[:4]!r})")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in SUPPORTED_VERSIONS:
        raise ModelFileError(f"{path}: unsupported GGUF version {version}")
    room = size - 24
    if n_kv * _MIN_KV_BYTES > room:
        raise ModelFileError(f"{path}: header claims {n_kv} metadata keys; the file holds at most {room // _MIN_KV_BYTES}")
    if n_tensors * _MIN_TENSOR_INFO_BYTES > room:
        raise ModelFileError(
            f"{path}: header claims {n_tensors} tensors; the file holds at most {room // _MIN_TENSOR_INFO_BYTES}"
        )


def _open_reader(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(path, "r")
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, struct.error, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path}: corrupt GGUF file ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read ({exc})") from None


def _field_type_name(field: Any) -> str:
    names = [t.name for t in field.types]
    if not names:
        return "?"
    if names[0] == "ARRAY":
        return f"ARRAY[{names[-1] if len(names) > 1 else '?'}]"
    return names[0]


def _read_metadata(reader: Any, source: str) -> dict[str, MetaValue]:
    out: dict[str, MetaValue] = {}
    try:
        for name, field in reader.fields.items():
            if name.startswith("GGUF."):
                continue
            out[name] = MetaValue(field.contents(), _field_type_name(field))
    except (ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{source}: unreadable metadata ({type(exc).__name__}: {exc})") from None
    return out


def _read_tensors(reader: Any, source: str) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for t in reader.tensors:
        if t.name in out:
            raise ModelFileError(f"{source}: duplicate tensor name {t.name!r}")
        ne = tuple(int(d) for d in t.shape)
        if any(d <= 0 for d in ne):
            raise ModelFileError(f"{source}: tensor {t.name!r} has dimensions {list(ne)}")
        expected = int(np.prod(ne))
        if int(t.tensor_type) in FLOAT_TYPES and int(t.data.size) != expected:
            raise ModelFileError(
                f"{source}: tensor {t.name!r} needs {expected} elements but the file holds {int(t.data.size)} "
                "(truncated file or offset outside the data)"
            )
        out[t.name] = TensorInfo(t.name, int(t.tensor_type), ne, t.data)
    return out
