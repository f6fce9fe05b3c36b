"""Small GGUF writing helpers for the converter (numpy + gguf only, no torch).

Shape convention: tensors are handed over in PyTorch/numpy order; the gguf writer stores
``ne`` as that shape reversed (ggml order), so ``ne == torch_shape[::-1]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from ..errors import ConfigError
from ..progress import ProgressCallback, report


@dataclass(frozen=True)
class MetaValue:
    """One metadata entry with its GGUF type (``sub_type`` for arrays)."""

    key: str
    value: Any
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclass(frozen=True)
class TensorData:
    """One tensor: numpy data in torch order, and the GGML type when it is not implied."""

    name: str
    data: np.ndarray
    raw_dtype: GGMLQuantizationType | None = None


def write_gguf(
    path: Path, arch: str, meta: Iterable[MetaValue], tensors: Iterable[TensorData],
    progress: ProgressCallback | None = None, task: str = "write",
) -> Path:
    """Write a GGUF file with ``general.architecture = arch``, then ``meta`` and ``tensors``.
    ``progress`` gets ``task`` reports in bytes of tensor data written (detail: the tensor)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = list(tensors)
    total = sum(t.data.nbytes for t in tensors)
    writer = GGUFWriter(str(path), arch)
    try:
        for m in meta:
            writer.add_key_value(m.key, m.value, m.vtype, sub_type=m.sub_type)
        for t in tensors:  # what GGUFWriter.add_tensor records, without holding the data
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, raw_dtype=t.raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        done = 0
        report(progress, task, 0, total, "bytes")
        for t in tensors:
            writer.write_tensor_data(t.data)
            done += t.data.nbytes
            report(progress, task, done, total, "bytes", t.name)
    finally:
        writer.close()
    return path


def field_value(reader: GGUFReader, key: str) -> Any:
    """The Python value of metadata ``key``; ConfigError naming it when absent."""
    field = reader.get_field(key)
    if field is None:
        raise ConfigError(f"GGUF metadata key {key!r} is missing")
    return field.contents()


def copy_field(reader: GGUFReader, key: str) -> MetaValue:
    """Metadata ``key`` of ``reader`` as a MetaValue with the same GGUF type."""
    field = reader.get_field(key)
    if field is None:
        raise ConfigError(f"GGUF metadata key {key!r} is missing")
    vtype = GGUFValueType(field.types[0])
    sub = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
    return MetaValue(key, field.contents(), vtype, sub)


def copy_tensor(reader_tensor: Any, name: str) -> TensorData:
    """A tensor from a GGUFReader under a new name, data bytes and type unchanged."""
    raw_type = GGMLQuantizationType(reader_tensor.tensor_type)
    return TensorData(name, np.asarray(reader_tensor.data), raw_type)
