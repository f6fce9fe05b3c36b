"""What every code-file format shares: the format-neutral :class:`CodeFile`, the
:class:`CodeFileFormat` each format class implements, and the checks on codes and transcripts."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from ..fileio import write_bytes_atomic
from ...checks import whole_number
from ...errors import CodeFileError

MAX_FILE_BYTES = 1 << 30  # no code file is near this: 1 hour of S2 codes is 3 MB
INT32 = np.iinfo(np.int32)
_F = TypeVar("_F", bound="CodeFileFormat")


@dataclass
class CodeFile:
    """Codes and what a file knows about them, whatever the format.

    ``codes``: int32 ``(n_codebooks, T)``, C-contiguous (any integer input is converted;
    values must fit in int32). ``sample_rate``: Hz, when the file says. ``n_samples``: the
    original audio length before padding, when known (then decode output can be trimmed).
    ``transcript``: the text spoken, when known (``.s2voice`` and ``.npz`` store it).
    ``meta``: the rest (``.npz``: pad_to, model_sha256, library_version, codebook_sizes,
    samples_per_frame, format_version; ``.s2voice``: version, codebook_size).
    """

    codes: np.ndarray
    sample_rate: int | None = None
    n_samples: int | None = None
    transcript: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.codes = as_codes(self.codes)

    @property
    def n_codebooks(self) -> int:
        return int(self.codes.shape[0])

    @property
    def n_frames(self) -> int:
        return int(self.codes.shape[1])


def as_codes(codes: Any) -> np.ndarray:
    """``codes`` as C-contiguous int32 ``(n_codebooks, T)``; CodeFileError for anything else."""
    arr = np.asarray(codes)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise CodeFileError(f"codes must be integers, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise CodeFileError(f"codes must be 2-D (n_codebooks, T), got shape {arr.shape}")
    if arr.shape[0] < 1:
        raise CodeFileError("codes have no codebooks")
    if arr.size and (int(arr.min()) < INT32.min or int(arr.max()) > INT32.max):
        raise CodeFileError("codes do not fit in int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


def encode_transcript(text: str, what: str = "a transcript") -> bytes:
    """The UTF-8 bytes a code file stores for ``text``; CodeFileError for text no file can hold
    (not a str, a NUL character, or a lone surrogate that has no UTF-8 form)."""
    if not isinstance(text, str):
        raise CodeFileError(f"{what} must be text (str), got {type(text).__name__}")
    if "\0" in text:
        raise CodeFileError(f"{what} cannot contain NUL characters (the C++ engine's reader ends it at the first NUL)")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CodeFileError(f"{what} is not valid Unicode text, it has no UTF-8 form ({exc.reason} at "
                            f"character {exc.start})") from None


def check_whole_number(name: str, value: Any) -> int:
    """``value`` as an int where it is one (an integer type, or a float with no fraction); CodeFileError
    naming ``name`` otherwise (44100.7 Hz was stored as 44100, "abc" failed inside int())."""
    count = whole_number(value)
    if count is None:
        raise CodeFileError(f"{name} must be a whole number, got {value!r}")
    return count


def check_int32(name: str, value: Any, low: int) -> int:
    """``value`` as an int in ``[low, 2**31 - 1]``; CodeFileError naming ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise CodeFileError(f"{name} must be an integer, got {value!r}")
    if not low <= int(value) <= INT32.max:
        raise CodeFileError(f"{name} = {value} is out of range ({low} to {INT32.max})")
    return int(value)


class CodeFileFormat(ABC):
    """One code-file format: its extension, its ``VERSION``, its bytes, and the conversion to and
    from the format-neutral :class:`CodeFile`. A subclass is a dataclass of the format's fields."""

    EXTENSION: ClassVar[str]
    VERSION: ClassVar[int]
    __hash__ = None  # mutable, like the dataclasses that implement it

    def __eq__(self, other: object) -> bool:
        """Two files are equal when they are of one format and their bytes are."""
        if type(other) is not type(self):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    @abstractmethod
    def to_bytes(self) -> bytes:
        """The file content."""

    @classmethod
    @abstractmethod
    def from_bytes(cls: type[_F], data: bytes) -> _F:
        """Parse file content; CodeFileError on anything malformed."""

    @classmethod
    @abstractmethod
    def from_code_file(cls: type[_F], cf: CodeFile) -> _F:
        """The fields of ``cf`` this format holds; CodeFileError when one it needs is missing."""

    @abstractmethod
    def to_code_file(self) -> CodeFile:
        """This file as a :class:`CodeFile`."""

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically to ``path``, which must end in :attr:`EXTENSION`; returns the path.
        CodeFileError for another extension."""
        if Path(path).suffix.lower() != self.EXTENSION:
            raise CodeFileError(f"{path}: a {self.EXTENSION} file must be named *{self.EXTENSION}")
        return write_bytes_atomic(path, self.to_bytes())

    @classmethod
    def load(cls: type[_F], path: str | os.PathLike) -> _F:
        """Read ``path`` as this format (whatever its name). Missing file: FileNotFoundError;
        anything malformed: CodeFileError naming the file and the reason."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such code file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise CodeFileError(f"{path}: {size} bytes is too large for a code file")
        data = path.read_bytes()
        try:
            return cls.from_bytes(data)
        except CodeFileError as exc:
            raise CodeFileError(f"{path}: {exc}") from None
