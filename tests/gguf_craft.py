"""A GGUF writer for broken files: every count, length, type and offset can be set by hand.

Independent of the library's parser (written with ``struct`` from the GGUF spec), so a test
that feeds its output to the loader does not check the parser against itself. A valid file
is read with the PyPI ``gguf`` reader (trusted on valid input only), edited as data, and
written back; ``Layout.offsets`` tells where each field landed so that single fields can
then be overwritten byte-exactly with :func:`patch`.

Value types (GGUF): 0 UINT8, 1 INT8, 2 UINT16, 3 INT16, 4 UINT32, 5 INT32, 6 FLOAT32,
7 BOOL, 8 STRING, 9 ARRAY, 10 UINT64, 11 INT64, 12 FLOAT64.
"""

from __future__ import annotations

import copy
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
SCALAR_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
                  FLOAT32: "<f", BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
F32, F16, Q8_0, BF16 = 0, 1, 8, 30
TYPE_BYTES = {F32: (1, 4), F16: (1, 2), Q8_0: (32, 34), BF16: (1, 2)}  # block, bytes per block


@dataclass
class KV:
    key: str
    vtype: int
    value: Any
    itype: int | None = None  # element type of an ARRAY
    raw: bytes | None = None  # if set, written instead of the encoded value


@dataclass
class TensorEntry:
    name: str
    ggml_type: int
    ne: list[int]
    data: bytes
    offset: int | None = None  # None: next aligned position


@dataclass
class Gguf:
    kvs: list[KV]
    tensors: list[TensorEntry]
    version: int = 3
    alignment: int = 32  # used to lay out the data (set general.alignment in kvs to declare it)
    n_tensors: int | None = None  # header counts; None: the real counts
    n_kv: int | None = None

    def copy(self) -> Gguf:
        return copy.deepcopy(self)

    def kv(self, key: str) -> KV:
        return next(k for k in self.kvs if k.key == key)

    def tensor(self, name: str) -> TensorEntry:
        return next(t for t in self.tensors if t.name == name)

    def set_kv(self, key: str, vtype: int, value: Any, itype: int | None = None) -> Gguf:
        kv = self.kv(key)
        kv.vtype, kv.value, kv.itype, kv.raw = vtype, value, itype, None
        return self

    def drop_kv(self, key: str) -> Gguf:
        self.kvs = [k for k in self.kvs if k.key != key]
        return self

    def drop_tensor(self, name: str) -> Gguf:
        self.tensors = [t for t in self.tensors if t.name != name]
        return self


@dataclass
class Layout:
    data: bytes
    offsets: dict[str, int] = field(default_factory=dict)


def _string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def encode_value(vtype: int, value: Any, itype: int | None = None) -> bytes:
    if vtype == STRING:
        return _string(value)
    if vtype == ARRAY:
        items = b"".join(encode_value(itype, v) for v in value)
        return struct.pack("<IQ", itype, len(value)) + items
    return struct.pack(SCALAR_FORMATS[vtype], value)


def write(g: Gguf) -> Layout:
    out = bytearray()
    offs: dict[str, int] = {}
    n_tensors = len(g.tensors) if g.n_tensors is None else g.n_tensors
    n_kv = len(g.kvs) if g.n_kv is None else g.n_kv
    out += b"GGUF" + struct.pack("<IQQ", g.version, n_tensors, n_kv)
    offs.update(version=4, n_tensors=8, n_kv=16)
    for kv in g.kvs:
        offs[f"kv:{kv.key}"] = len(out)
        out += _string(kv.key)
        offs[f"kv:{kv.key}:type"] = len(out)
        out += struct.pack("<I", kv.vtype)
        offs[f"kv:{kv.key}:value"] = len(out)
        out += kv.raw if kv.raw is not None else encode_value(kv.vtype, kv.value, kv.itype)
    placed, cursor = [], 0
    for t in g.tensors:
        off = -(-cursor // g.alignment) * g.alignment if t.offset is None else t.offset
        placed.append(off)
        cursor = max(cursor, off + len(t.data))
        offs[f"ti:{t.name}"] = len(out)
        out += _string(t.name)
        offs[f"ti:{t.name}:n_dims"] = len(out)
        out += struct.pack("<I", len(t.ne))
        offs[f"ti:{t.name}:dims"] = len(out)
        out += struct.pack(f"<{len(t.ne)}Q", *t.ne)
        offs[f"ti:{t.name}:type"] = len(out)
        out += struct.pack("<I", t.ggml_type)
        offs[f"ti:{t.name}:offset"] = len(out)
        out += struct.pack("<Q", off)
    data_start = -(-len(out) // g.alignment) * g.alignment
    offs["data"] = data_start
    body = bytearray(-(-cursor // g.alignment) * g.alignment)
    for t, off in zip(g.tensors, placed):
        if off + len(t.data) <= len(body):
            body[off:off + len(t.data)] = t.data
    out += bytes(data_start - len(out)) + body
    return Layout(bytes(out), offs)


def patch(data: bytes, offset: int, fmt: str, value: Any) -> bytes:
    """``data`` with ``struct.pack(fmt, value)`` written at ``offset``."""
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


def read(path: str | Path) -> Gguf:
    """A valid GGUF file as editable data (values, types and raw tensor bytes kept)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    kvs = []
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [int(t) for t in f.types]
        kvs.append(KV(name, types[0], f.contents(), types[-1] if types[0] == ARRAY else None))
    tensors = [TensorEntry(t.name, int(t.tensor_type), [int(d) for d in t.shape], np.asarray(t.data).tobytes())
               for t in r.tensors]
    align = r.fields.get("general.alignment")
    return Gguf(kvs, tensors, alignment=int(align.contents()) if align else 32)


def small() -> Gguf:
    """A small valid file (3 keys, 3 tensors) whose every byte can be truncated cheaply."""
    rng = np.random.default_rng(0)
    return Gguf(
        kvs=[KV("general.architecture", STRING, "fish-speech-codec"),
             KV("test.count", UINT32, 7),
             KV("test.list", ARRAY, [1, 2, 3], itype=INT32)],
        tensors=[TensorEntry("a", F32, [4, 2], rng.standard_normal(8).astype(np.float32).tobytes()),
                 TensorEntry("b", F16, [3], rng.standard_normal(3).astype(np.float16).tobytes()),
                 TensorEntry("c.d", F32, [2, 1, 1, 2], rng.standard_normal(4).astype(np.float32).tobytes())],
    )
