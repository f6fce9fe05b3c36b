"""Code files: the upstream ``.npy``, the C++ engine's ``.s2voice`` and this project's ``.npz``.

Codes are ``(n_codebooks, T)`` integers, codebook-major (``codes[cb, t]``). Each format is one
class holding exactly what its files hold, with the format's ``VERSION``, ``to_bytes`` /
``from_bytes``, ``save(path)`` (atomic: temp file in the same folder, then ``os.replace``) and
``load(path)``: :class:`NpyFile` (``npy.py``), :class:`S2VoiceFile` (``s2voice.py``) and
:class:`NpzFile` (``npz.py``). :class:`CodeFile` is the format-neutral value the codec commands
pass around; :func:`read_codes` and :func:`write_codes` choose the format class by extension
and convert. Every reader checks each length field against the file size before it allocates
anything, and every problem raises :class:`CodeFileError` with the reason.

Transcripts are stored as UTF-8 and may not contain NUL (the C++ engine's reader ends a
transcript at its first NUL); :func:`encode_transcript` is that rule.
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import MAX_FILE_BYTES, CodeFile, CodeFileFormat, encode_transcript
from .npy import NpyFile
from .npz import NpzFile
from .s2voice import S2VoiceFile
from ...errors import CodeFileError

__all__ = [
    "EXTENSIONS", "FORMATS", "MAX_FILE_BYTES", "CodeFile", "CodeFileError", "CodeFileFormat", "NpyFile", "NpzFile",
    "S2VoiceFile", "encode_transcript", "format_class", "format_of", "from_bytes", "read_codes", "to_bytes", "write_codes",
]

EXTENSIONS = (".npz", ".npy", ".s2voice")
FORMATS: dict[str, type[CodeFileFormat]] = {"npz": NpzFile, "npy": NpyFile, "s2voice": S2VoiceFile}
# The layout constants under their 0.1 names.
S2VOICE_MAGIC = S2VoiceFile.MAGIC
S2VOICE_VERSION = S2VoiceFile.VERSION
S2VOICE_HEADER = S2VoiceFile.HEADER
NPZ_FORMAT_VERSION = NpzFile.VERSION
NPZ_MEMBERS = NpzFile.MEMBERS


def format_of(path: str | os.PathLike) -> str:
    """The code-file kind an extension names: "npz", "npy" or "s2voice"; CodeFileError otherwise."""
    ext = Path(path).suffix.lower()
    if ext not in EXTENSIONS:
        raise CodeFileError(f"{path}: unknown code file extension {ext or '(none)'!r}; use one of {', '.join(EXTENSIONS)}")
    return ext[1:]


def format_class(kind: str) -> type[CodeFileFormat]:
    """The class of the kind ``format_of`` names; CodeFileError for an unknown kind."""
    if kind not in FORMATS:
        raise CodeFileError(f"unknown code file kind {kind!r}")
    return FORMATS[kind]


def read_codes(path: str | os.PathLike) -> CodeFile:
    """Read a code file, the format chosen by extension. Missing file: FileNotFoundError."""
    return FORMATS[format_of(path)].load(path).to_code_file()


def write_codes(path: str | os.PathLike, cf: CodeFile) -> Path:
    """Write ``cf`` atomically in the format the extension names; returns the path."""
    return FORMATS[format_of(path)].from_code_file(cf).save(path)


def to_bytes(cf: CodeFile, kind: str) -> bytes:
    """The file content ``write_codes`` would write for ``kind`` ("npz", "npy", "s2voice")."""
    return format_class(kind).from_code_file(cf).to_bytes()


def from_bytes(data: bytes, kind: str) -> CodeFile:
    """Parse file content of ``kind``; CodeFileError on anything malformed."""
    return format_class(kind).from_bytes(bytes(data)).to_code_file()
