"""The GGUF fuzz body, shared by the hypothesis test and its crash-guard child process.

A mutation is a list of edits applied in order to the bytes of a valid file:
``("byte", pos, value)``, ``("word", pos, fmt, value)`` (a boundary integer written over
whatever was there, e.g. a count or a length) and ``("truncate", n)``.
"""

from __future__ import annotations

import random
import struct

import pyggml_codec
from pyggml_codec.model.gguf_file import ModelFile

BOUNDARY = (0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 32, 33, 64, 255, 2**15, 2**16 - 1, 2**31 - 1, 2**31,
            2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
WORD_FORMATS = ("<I", "<Q")


def apply(data: bytes, edits: list[tuple]) -> bytes:
    out = bytearray(data)
    for e in edits:
        if e[0] == "byte" and e[1] < len(out):
            out[e[1]] = e[2]
        elif e[0] == "word" and e[1] + struct.calcsize(e[2]) <= len(out):
            fmt, value = e[2], e[3] if e[2] == "<Q" else e[3] & 0xFFFFFFFF
            struct.pack_into(fmt, out, e[1], value)
        elif e[0] == "truncate":
            del out[e[1]:]
    return bytes(out)


def load_or_refuse(data: bytes) -> str:
    """"refused" (a ModelFileError with a reason) or "loaded"; anything else propagates."""
    try:
        mf = ModelFile.from_buffer(data, "<fuzz>")
        codec = pyggml_codec.load(mf, "cpu", n_threads=1)
    except pyggml_codec.ModelFileError as exc:
        if not str(exc).strip():
            raise AssertionError("ModelFileError without a reason") from exc
        return "refused"
    codec.close()
    return "loaded"


def random_edits(rng: random.Random, header_end: int, size: int) -> list[tuple]:
    """The child's version of the hypothesis strategy (same kinds of edit, same ranges)."""
    edits: list[tuple] = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.45:
            edits.append(("byte", rng.randrange(header_end), rng.randrange(256)))
        elif kind < 0.8:
            edits.append(("word", rng.randrange(header_end), rng.choice(WORD_FORMATS), rng.choice(BOUNDARY)))
        elif kind < 0.9:
            edits.append(("byte", rng.randrange(header_end, size), rng.randrange(256)))
        else:
            edits.append(("truncate", rng.randrange(size)))
    return edits
