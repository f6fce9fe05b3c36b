"""The C++ engine's voice profile, ``.s2voice``."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import (INT32, CodeFile, CodeFileFormat, as_codes, check_int32, check_whole_number,
                   encode_transcript)
from ...errors import CodeFileError


@dataclass(eq=False)  # equal when their bytes are (CodeFileFormat.__eq__)
class S2VoiceFile(CodeFileFormat):
    """The C++ engine's voice profile (s2.cpp's ``VoiceProfile::save`` / ``load``), byte for byte.

    Little-endian, no padding, no checksum::

      offset size  field
      0      8     magic b"S2VOICE\\0"
      8      4     u32 version (1)
      12     4     i32 num_codebooks
      16     4     i32 T (frames)
      20     4     i32 sample_rate
      24     4     i32 codebook_size
      28     8     u64 transcript_len  (UTF-8 bytes + 1: the NUL terminator counts)
      36     8     u64 codes_size      (bytes: num_codebooks * T * 4)
      44     ...   transcript bytes, then NUL
      ...    ...   int32 codes, codebook-major; the file ends here

    The engine uses a profile as a voice-clone prompt only with a non-empty transcript (the
    text the reference audio speaks).
    """

    EXTENSION: ClassVar[str] = ".s2voice"
    VERSION: ClassVar[int] = 1
    MAGIC: ClassVar[bytes] = b"S2VOICE\0"
    HEADER: ClassVar[struct.Struct] = struct.Struct("<8sIiiiiQQ")  # 44 bytes
    codes: np.ndarray
    sample_rate: int
    codebook_size: int
    transcript: str = ""

    def __post_init__(self) -> None:
        self.codes = as_codes(self.codes)
        self.sample_rate = check_int32("s2voice sample_rate", self.sample_rate, 1)
        self.codebook_size = check_int32("s2voice codebook_size", self.codebook_size, 1)
        check_int32("s2voice T", self.codes.shape[1], 0)
        encode_transcript(self.transcript, "an s2voice transcript")

    def to_bytes(self) -> bytes:
        text = encode_transcript(self.transcript, "an s2voice transcript")
        n_cb, n_frames = self.codes.shape
        header = self.HEADER.pack(self.MAGIC, self.VERSION, n_cb, n_frames, self.sample_rate, self.codebook_size,
                                  len(text) + 1, n_cb * n_frames * 4)
        return header + text + b"\0" + self.codes.astype("<i4").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> S2VoiceFile:
        head = cls.HEADER
        if len(data) < head.size:
            raise CodeFileError(f"{len(data)} bytes is too short for the {head.size}-byte s2voice header")
        magic, version, n_cb, n_frames, rate, cb_size, text_len, codes_size = head.unpack_from(data)
        if magic != cls.MAGIC:
            raise CodeFileError(f"not an s2voice file (magic {magic!r})")
        if version != cls.VERSION:
            raise CodeFileError(f"unsupported s2voice version {version} (this library reads {cls.VERSION})")
        for name, value in (("num_codebooks", n_cb), ("sample_rate", rate), ("codebook_size", cb_size)):
            if value < 1:
                raise CodeFileError(f"s2voice {name} = {value} is impossible")
        if n_frames < 0:
            raise CodeFileError(f"s2voice T = {n_frames} is impossible")
        if codes_size != n_cb * n_frames * 4:
            raise CodeFileError(f"s2voice codes_size = {codes_size} bytes, but {n_cb} x {n_frames} int32 codes "
                                f"take {n_cb * n_frames * 4}")
        if text_len < 1:
            raise CodeFileError("s2voice transcript_len = 0 (the NUL terminator is counted, so it is at least 1)")
        expected = head.size + text_len + codes_size
        if expected != len(data):
            what = "truncated" if expected > len(data) else f"{len(data) - expected} trailing bytes"
            raise CodeFileError(f"s2voice header implies {expected} bytes, the file has {len(data)} ({what})")
        text = data[head.size:head.size + text_len]
        if text[-1] != 0:
            raise CodeFileError("s2voice transcript is not NUL-terminated")
        if 0 in text[:-1]:
            raise CodeFileError("s2voice transcript contains a NUL byte before its end")
        try:
            transcript = text[:-1].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CodeFileError(f"s2voice transcript is not UTF-8 ({exc})") from None
        codes = np.frombuffer(data, dtype="<i4", count=n_cb * n_frames, offset=head.size + text_len)
        return cls(codes.reshape(n_cb, n_frames), rate, cb_size, transcript)

    @classmethod
    def from_code_file(cls, cf: CodeFile) -> S2VoiceFile:
        """``codebook_size`` comes from ``meta['codebook_size']``, else the largest of
        ``meta['codebook_sizes']`` (the engine checks it against its model's codebook size)."""
        if cf.transcript is not None:
            encode_transcript(cf.transcript, "an s2voice transcript")
        rate = check_whole_number("sample_rate", cf.sample_rate) if cf.sample_rate is not None else 0
        if not 0 < rate <= INT32.max:
            raise CodeFileError(f"an s2voice file needs a positive int32 sample_rate, got {cf.sample_rate!r}")
        if cf.meta.get("codebook_size") is not None:
            cb_size = check_whole_number("codebook_size", cf.meta["codebook_size"])
        elif cf.meta.get("codebook_sizes"):
            cb_size = check_whole_number("codebook_sizes", max(cf.meta["codebook_sizes"]))
        else:
            raise CodeFileError("an s2voice file needs a codebook_size (meta['codebook_size'] or meta['codebook_sizes'])")
        if not 0 < cb_size <= INT32.max or cf.n_frames > INT32.max:
            raise CodeFileError(f"s2voice fields out of int32 range (codebook_size {cb_size}, T {cf.n_frames})")
        return cls(cf.codes, rate, cb_size, cf.transcript or "")

    def to_code_file(self) -> CodeFile:
        return CodeFile(self.codes, sample_rate=self.sample_rate, transcript=self.transcript,
                        meta={"version": self.VERSION, "codebook_size": self.codebook_size})
