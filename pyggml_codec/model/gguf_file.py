"""Opening GGUF files defensively.

The PyPI ``gguf`` reader trusts the header: given a huge tensor or key count, a huge
string length or a truncated file it raises bare ``IndexError``/``ValueError``, and given
a huge array length it loops once per claimed entry, appending to a list (unbounded time
and memory for a few bytes of file). So :meth:`ModelFile.open` does not use it: it walks
the file itself over a read-only memory map, checks every length, count, type, dimension
and offset against the bytes that are really there before reading or allocating anything
sized by it, and raises :class:`ModelFileError` with the reason and the byte offset.
The checks follow ggml's own ``gguf.cpp``:

* header: magic ``GGUF``, version 2 or 3, counts that fit in the file;
* metadata: UTF-8 keys of 1..65535 bytes, no duplicates, known value types, no nested
  arrays, ``general.alignment`` a non-zero power of two (UINT32);
* tensor infos: UTF-8 names of 1..65535 bytes, no duplicates, 1..4 dimensions each in
  [1, 2**63), a known ggml type whose block size divides ``ne[0]``, an offset that is a
  multiple of the alignment, data inside the file and not overlapping another tensor.

Tensor data stays in the memory map (read-only numpy views); metadata values become
Python values, so memory use is bounded by a small multiple of the file's header size.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
HEADER_BYTES = 24  # magic, u32 version, u64 tensor count, u64 key-value count
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 65535  # the GGUF spec's limit for keys; used for tensor names too
DEFAULT_ALIGNMENT = 32
# Smallest possible encodings: a key-value pair is a u64 key length, one key byte, a u32
# type and at least one value byte; a tensor info is a u64 name length, one name byte, a
# u32 n_dims, one u64 dim, a u32 type and a u64 offset.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8
# ggml types this library can load (others are named in the error).
FLOAT_TYPES = {0: "F32", 1: "F16"}
_FLOAT_DTYPES = {0: np.float32, 1: np.float16}

# GGUF value types: name, struct format (scalars) / None (string, array).
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"),
    4: ("UINT32", "<I"), 5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<B"),
    8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", "<Q"), 11: ("INT64", "<q"),
    12: ("FLOAT64", "<d"),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7


@functools.lru_cache(maxsize=1)
def ggml_type_sizes() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, block size, bytes per block), from the ``gguf`` package."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(t): (t.name, block, size) for t, (block, size) in GGML_QUANT_SIZES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: ``ne`` is ggml order, ``data`` a read-only memory map
    (numpy shape = ``ne`` reversed for F32/F16; raw ``uint8`` bytes for other types)."""

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
        known = ggml_type_sizes().get(self.ggml_type)
        return known[0] if known else f"type {self.ggml_type}"

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

    def __init__(self, source: str, metadata: dict[str, MetaValue], tensors: dict[str, TensorInfo]):
        self.source = source
        self.metadata = metadata
        self.tensors = tensors

    @classmethod
    def open(cls, path: str | os.PathLike) -> ModelFile:
        path = Path(path)
        if not path.is_file():
            raise ModelFileError(f"{path}: no such model file")
        try:
            size = path.stat().st_size
            buf = np.memmap(path, dtype=np.uint8, mode="r") if size else b""  # mmap refuses empty files
        except OSError as exc:
            raise ModelFileError(f"{path}: cannot read ({exc})") from None
        return cls.from_buffer(buf, str(path))

    @classmethod
    def from_buffer(cls, buf: np.ndarray | bytes, source: str = "<buffer>") -> ModelFile:
        """Parse a whole GGUF file held in ``buf`` (a ``uint8`` array or bytes; not copied)."""
        if not isinstance(buf, np.ndarray):
            buf = np.frombuffer(buf, dtype=np.uint8)
        metadata, tensors = Parser(buf, source).parse()
        return cls(source, metadata, tensors)

    @classmethod
    def from_reader(cls, reader: Any) -> ModelFile:
        """Wrap a ``gguf.GGUFReader`` that the host application already opened."""
        if not hasattr(reader, "fields") or not hasattr(reader, "tensors"):
            raise ModelFileError(f"expected a gguf.GGUFReader, got {type(reader).__name__}")
        source = str(getattr(reader, "path", "<reader>"))
        return cls(source, _reader_metadata(reader, source), _reader_tensors(reader, source))

    @property
    def architecture(self) -> str:
        meta = self.metadata.get("general.architecture")
        if meta is None:
            raise ModelFileError(f"{self.source}: no general.architecture key")
        if meta.type_name != "STRING":
            raise ModelFileError(f"{self.source}: general.architecture is {meta.type_name}, expected STRING")
        return meta.value


# --------------------------------------------------------------------------- the parser


class Parser:
    """A bounds-checked walk over one GGUF file; every failure names the byte offset."""

    def __init__(self, buf: np.ndarray, source: str):
        self.buf, self.source, self.size, self.pos = buf, source, int(buf.shape[0]), 0
        self.raw = memoryview(buf)  # struct and slicing without numpy's per-call overhead
        self.key_at: dict[str, int] = {}  # where each metadata key starts, for later errors

    def fail(self, what: str, at: int | None = None) -> ModelFileError:
        return ModelFileError(f"{self.source}: {what} (at byte {self.pos if at is None else at})")

    def need(self, n: int, what: str) -> int:
        """Claim ``n`` bytes at the cursor; the start offset. Nothing past the end is read."""
        if n > self.size - self.pos:
            raise self.fail(f"truncated file: {what} needs {n} bytes, {self.size - self.pos} left")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.raw, self.need(struct.calcsize(fmt), what))[0]

    def text(self, what: str) -> str:
        at = self.pos
        n = self.scalar("<Q", f"length of {what}")
        if not 1 <= n <= MAX_NAME_BYTES:
            raise self.fail(f"{what} has length {n} (must be 1..{MAX_NAME_BYTES})", at)
        return self.utf8(self.need(n, what), n, what)

    def utf8(self, start: int, n: int, what: str) -> str:
        try:
            return str(self.raw[start:start + n], "utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8", start) from None

    def read_metadata(self, n_kv: int) -> tuple[dict[str, MetaValue], dict[str, tuple[int, int]]]:
        """The ``n_kv`` key/value pairs at the read position, and each pair's byte span."""
        metadata: dict[str, MetaValue] = {}
        spans: dict[str, tuple[int, int]] = {}
        for i in range(n_kv):
            at = self.pos
            key = self.text(f"metadata key {i}")
            if key in metadata:
                raise self.fail(f"duplicate metadata key {key!r}", at)
            self.key_at[key] = at
            metadata[key] = self.value(key)
            spans[key] = (at, self.pos)
        return metadata, spans

    def parse(self) -> tuple[dict[str, MetaValue], dict[str, TensorInfo]]:
        n_tensors, n_kv = self.header()
        metadata, _ = self.read_metadata(n_kv)
        infos = [self.tensor_info(i) for i in range(n_tensors)]
        alignment = self.alignment(metadata)
        data_start = -(-self.pos // alignment) * alignment
        return metadata, self.tensors(infos, data_start, alignment)

    def header(self) -> tuple[int, int]:
        if self.size < HEADER_BYTES:
            raise self.fail(f"{self.size} bytes is too short for a GGUF header ({HEADER_BYTES} bytes)", 0)
        magic = bytes(self.raw[:4])
        if magic != GGUF_MAGIC:
            raise self.fail(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})", 0)
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", self.raw, 4)
        if version not in SUPPORTED_VERSIONS:
            why = ("GGUF version 1 is obsolete" if version == 1 else
                   "a big-endian GGUF file" if struct.unpack("<I", struct.pack(">I", version))[0] in SUPPORTED_VERSIONS else
                   f"unsupported GGUF version {version}")
            raise self.fail(f"{why}; versions {list(SUPPORTED_VERSIONS)} are supported", 4)
        self.pos = HEADER_BYTES
        room = self.size - HEADER_BYTES
        if n_kv > room // _MIN_KV_BYTES:
            raise self.fail(f"header claims {n_kv} metadata keys; the file holds at most {room // _MIN_KV_BYTES}", 16)
        if n_tensors > room // _MIN_TENSOR_INFO_BYTES:
            raise self.fail(
                f"header claims {n_tensors} tensors; the file holds at most {room // _MIN_TENSOR_INFO_BYTES}", 8)
        return n_tensors, n_kv

    def value_type(self, what: str, allow_array: bool) -> int:
        at = self.pos
        vtype = self.scalar("<I", f"value type of {what}")
        if vtype not in VALUE_TYPES or (vtype == _ARRAY and not allow_array):
            kind = "nested array" if vtype == _ARRAY else f"unknown value type {vtype}"
            raise self.fail(f"metadata key {what!r} has {kind}", at)
        return vtype

    def value(self, key: str) -> MetaValue:
        vtype = self.value_type(key, allow_array=True)
        if vtype != _ARRAY:
            return MetaValue(self.item(vtype, key), VALUE_TYPES[vtype][0])
        itype = self.value_type(key, allow_array=False)
        at = self.pos
        count = self.scalar("<Q", f"array length of {key!r}")
        fmt = VALUE_TYPES[itype][1]
        least = struct.calcsize(fmt) if fmt else 8  # a string is at least its u64 length
        if count > (self.size - self.pos) // least:
            raise self.fail(f"metadata array {key!r} claims {count} entries; only {self.size - self.pos} bytes left", at)
        if fmt is None:
            values: list = [self.string(key) for _ in range(count)]
        else:
            start = self.need(count * least, f"array {key!r}")
            values = np.frombuffer(self.buf, np.dtype(fmt), count, start).tolist()
            if itype == _BOOL:
                values = [bool(v) for v in values]
        return MetaValue(values, f"ARRAY[{VALUE_TYPES[itype][0]}]")

    def item(self, vtype: int, key: str):
        if vtype == _STRING:
            return self.string(key)
        value = self.scalar(VALUE_TYPES[vtype][1], f"value of {key!r}")
        return bool(value) if vtype == _BOOL else value

    def string(self, key: str) -> str:
        at = self.pos
        n = self.scalar("<Q", f"string length in {key!r}")
        if n > self.size - self.pos:
            raise self.fail(f"string in {key!r} claims {n} bytes; only {self.size - self.pos} left", at)
        return self.utf8(self.need(n, f"string in {key!r}"), n, f"string in {key!r}")

    def tensor_info(self, i: int) -> tuple[str, int, tuple[int, ...], int, int]:
        at = self.pos
        name = self.text(f"tensor name {i}")
        n_dims = self.scalar("<I", f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"tensor {name!r} has {n_dims} dimensions (must be 1..{MAX_DIMS})", at)
        ne = struct.unpack_from(f"<{n_dims}Q", self.raw, self.need(8 * n_dims, f"dimensions of {name!r}"))
        if any(not 1 <= d < 2**63 for d in ne):
            raise self.fail(f"tensor {name!r} has dimensions {list(ne)} (each must be in [1, 2**63))", at)
        ggml_type = self.scalar("<I", f"type of {name!r}")
        known = ggml_type_sizes().get(ggml_type)
        if known is None:
            raise self.fail(f"tensor {name!r} has unknown ggml type {ggml_type}", at)
        type_name, block, type_size = known
        if ne[0] % block:
            raise self.fail(f"tensor {name!r}: ne[0] = {ne[0]} is not a multiple of the {type_name} block size {block}", at)
        offset = self.scalar("<Q", f"data offset of {name!r}")
        return name, ggml_type, tuple(ne), offset, math.prod(ne) // block * type_size

    def alignment(self, metadata: dict[str, MetaValue]) -> int:
        meta = metadata.get("general.alignment")
        if meta is None:
            return DEFAULT_ALIGNMENT
        at = self.key_at["general.alignment"]
        if meta.type_name != "UINT32":
            raise self.fail(f"general.alignment is {meta.type_name}, expected UINT32", at)
        value = int(meta.value)
        if value == 0 or value & (value - 1):
            raise self.fail(f"general.alignment = {value} is not a non-zero power of two", at)
        return value

    def tensors(self, infos: list, data_start: int, alignment: int) -> dict[str, TensorInfo]:
        out: dict[str, TensorInfo] = {}
        room = max(0, self.size - data_start)
        for name, ggml_type, ne, offset, nbytes in infos:
            if name in out:
                raise self.fail(f"duplicate tensor name {name!r}", data_start)
            if offset % alignment:
                raise self.fail(f"tensor {name!r} has offset {offset}, not a multiple of the alignment {alignment}")
            if offset > room or nbytes > room - offset:
                raise self.fail(
                    f"tensor {name!r} needs bytes {offset}..{offset + nbytes} of the data section, which has "
                    f"{room} bytes (truncated file or offset outside the data)", data_start)
            out[name] = TensorInfo(name, ggml_type, ne, self.view(data_start + offset, nbytes, ggml_type, ne))
        check_overlaps(self, infos, data_start)
        return out

    def view(self, start: int, nbytes: int, ggml_type: int, ne: tuple[int, ...]) -> np.ndarray:
        raw = self.buf[start:start + nbytes]
        if ggml_type in _FLOAT_DTYPES:
            return raw.view(_FLOAT_DTYPES[ggml_type]).reshape(tuple(reversed(ne)))
        return raw


def check_overlaps(p: Parser, infos: list, data_start: int) -> None:
    spans = sorted((offset, offset + nbytes, name) for name, _t, _ne, offset, nbytes in infos)
    for (_s0, end0, name0), (start1, _e1, name1) in itertools.pairwise(spans):
        if start1 < end0:
            raise p.fail(f"tensors {name0!r} and {name1!r} overlap in the data section", data_start + start1)


# --------------------------------------------------------------------------- host readers


def _field_type_name(field: Any) -> str:
    names = [t.name for t in field.types]
    if not names:
        return "?"
    if names[0] == "ARRAY":
        return f"ARRAY[{names[-1] if len(names) > 1 else '?'}]"
    return names[0]


def _reader_metadata(reader: Any, source: str) -> dict[str, MetaValue]:
    out: dict[str, MetaValue] = {}
    try:
        for name, field in reader.fields.items():
            if name.startswith("GGUF."):
                continue
            out[name] = MetaValue(field.contents(), _field_type_name(field))
    except (ValueError, IndexError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{source}: unreadable metadata ({type(exc).__name__}: {exc})") from None
    return out


def _reader_tensors(reader: Any, source: str) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for t in reader.tensors:
        if t.name in out:
            raise ModelFileError(f"{source}: duplicate tensor name {t.name!r}")
        ne = tuple(int(d) for d in t.shape)
        if not 1 <= len(ne) <= MAX_DIMS or any(d <= 0 for d in ne):
            raise ModelFileError(f"{source}: tensor {t.name!r} has dimensions {list(ne)}")
        expected = math.prod(ne)  # Python ints: no silent overflow
        if int(t.tensor_type) in FLOAT_TYPES and int(t.data.size) != expected:
            raise ModelFileError(
                f"{source}: tensor {t.name!r} needs {expected} elements but the file holds {int(t.data.size)} "
                "(truncated file or offset outside the data)"
            )
        out[t.name] = TensorInfo(t.name, int(t.tensor_type), ne, t.data)
    return out
