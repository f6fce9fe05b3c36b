"""A GGUF file known by its first bytes only: the header, read as far as it goes, and a compact
GGUF holding a chosen subset of the tensors.

``parse_header(prefix, total_size)`` walks the header with the same bounds checks as
:mod:`.gguf_file` (lengths and counts against the whole file's size) and raises
:class:`HeaderIncomplete` with the byte count it needs when ``prefix`` ends before the tensor
table does; a caller reading over the network grows its prefix until the parse succeeds.
The result tells where every tensor's bytes lie in the remote file, so only the wanted ones
need to be read. :func:`compact_header` lays those tensors out in a small GGUF of their own
(the selected metadata copied byte for byte, offsets recomputed), which the ordinary
readers and the converter then open like any other file.

    >>> import struct
    >>> hdr = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)
    >>> parse_header(hdr, len(hdr)).tensors
    []
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from .gguf_file import HEADER_BYTES, MetaValue, ModelFile, TensorInfo, check_overlaps, Parser


class HeaderIncomplete(Exception):
    """The prefix ends inside the header; ``needed`` bytes from the start would reach further."""

    def __init__(self, needed: int):
        super().__init__(f"the GGUF header needs at least {needed} bytes")
        self.needed = needed


@dataclass(frozen=True)
class RemoteTensor:
    """One tensor of the remote file: ``start`` is its absolute byte offset there."""

    name: str
    ggml_type: int
    ne: tuple[int, ...]
    start: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.start + self.nbytes


@dataclass(frozen=True)
class HeaderLayout:
    """What the header of a GGUF file says, with the byte spans needed to copy parts of it."""

    source: str
    size: int  # of the whole file
    version: int
    alignment: int
    metadata: dict[str, MetaValue]
    kv_spans: dict[str, tuple[int, int]]  # key -> [start, end) of its key-value entry
    tensors: list[RemoteTensor]  # in file order
    header_end: int  # end of the tensor-info table
    data_start: int
    digest: str  # sha256 of bytes [0, header_end)

    @property
    def architecture(self) -> str | None:
        meta = self.metadata.get("general.architecture")
        return meta.value if meta is not None and meta.type_name == "STRING" else None

    def model_file(self, tensors: list[RemoteTensor]) -> ModelFile:
        """A :class:`ModelFile` of the metadata and ``tensors`` for the strict checks of
        the model layer; the tensors' ``data`` are zero-copy placeholders of the right size
        (no bytes are read)."""
        infos = {t.name: TensorInfo(t.name, t.ggml_type, t.ne, np.broadcast_to(np.uint8(0), (t.nbytes,)))
                 for t in tensors}
        return ModelFile(self.source, dict(self.metadata), infos)


class _PrefixParser(Parser):
    """The bounds-checked walk of :mod:`.gguf_file` over the first bytes of a longer file:
    checks use the whole file's size, reads past the prefix raise HeaderIncomplete."""

    def __init__(self, prefix: np.ndarray, total: int, source: str):
        super().__init__(prefix, source)
        self.have, self.size = self.size, total

    def need(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            raise self.fail(f"truncated file: {what} needs {n} bytes, {self.size - self.pos} left")
        if self.pos + n > self.have:
            raise HeaderIncomplete(self.pos + n)
        start, self.pos = self.pos, self.pos + n
        return start


def parse_header(prefix: bytes | bytearray | memoryview, total_size: int, source: str = "<remote>") -> HeaderLayout:
    """Parse the header of a GGUF file of ``total_size`` bytes from its first bytes.

    Raises :class:`HeaderIncomplete` when ``prefix`` is too short, ModelFileError naming
    ``source`` and the byte offset when the header is not a valid GGUF header.
    """
    buf = np.frombuffer(bytes(prefix), dtype=np.uint8)
    if len(buf) < min(HEADER_BYTES, total_size):
        raise HeaderIncomplete(HEADER_BYTES)
    p = _PrefixParser(buf, total_size, source)
    n_tensors, n_kv = p.header()
    version = struct.unpack_from("<I", p.raw, 4)[0]
    metadata, spans = p.read_metadata(n_kv)
    infos = [p.tensor_info(i) for i in range(n_tensors)]
    header_end = p.pos
    alignment = p.alignment(metadata)
    data_start = -(-header_end // alignment) * alignment
    room = max(0, total_size - data_start)
    seen: set[str] = set()
    tensors = []
    for name, ggml_type, ne, offset, nbytes in infos:
        if name in seen:
            raise p.fail(f"duplicate tensor name {name!r}", data_start)
        seen.add(name)
        if offset % alignment:
            raise p.fail(f"tensor {name!r} has offset {offset}, not a multiple of the alignment {alignment}")
        if offset > room or nbytes > room - offset:
            raise p.fail(f"tensor {name!r} needs bytes {offset}..{offset + nbytes} of the data section, which has "
                         f"{room} bytes (truncated file or offset outside the data)", data_start)
        tensors.append(RemoteTensor(name, ggml_type, ne, data_start + offset, nbytes))
    check_overlaps(p, infos, data_start)
    digest = hashlib.sha256(buf[:header_end]).hexdigest()
    return HeaderLayout(source, total_size, version, alignment, metadata, spans, tensors, header_end,
                        data_start, digest)


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def compact_header(layout: HeaderLayout, prefix: bytes, keys: list[str],
                   tensors: list[RemoteTensor]) -> tuple[bytes, list[int], int]:
    """A GGUF header holding the metadata ``keys`` (their entries copied from ``prefix``, in
    file order) and the tensor infos of ``tensors`` packed one after another.

    Returns the header (padded to the data section), each tensor's absolute offset in the
    compact file, and the compact file's size. Alignment and GGUF version are the source's.
    """
    wanted = set(keys)
    kv = [prefix[s:e] for key, (s, e) in layout.kv_spans.items() if key in wanted]
    infos, offsets, rel = [], [], 0
    for t in tensors:
        name = t.name.encode("utf-8")
        infos.append(struct.pack(f"<Q{len(name)}sI{len(t.ne)}QIQ", len(name), name, len(t.ne), *t.ne, t.ggml_type, rel))
        offsets.append(rel)
        rel = _align(rel + t.nbytes, layout.alignment)
    head = b"".join([b"GGUF", struct.pack("<IQQ", layout.version, len(tensors), len(kv)), *kv, *infos])
    data_start = _align(len(head), layout.alignment)
    head += bytes(data_start - len(head))
    size = data_start + (offsets[-1] + tensors[-1].nbytes if tensors else 0)
    return head, [data_start + o for o in offsets], size

