"""Audio files to code files, one at a time: reading (any format soundfile reads, any rate and
channel count, resampled as the CLI does), encoding, writing the code file atomically, and the
mirror of a corpus tree into an output tree. Shared by the CLI's directory mode and the Ray
corpus job (``dataset/``), so both write byte-identical files.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .._version import __version__
from ..codec import Codec
from ..inputs import MAX_ENCODE_SECONDS
from ..io.audio import read_audio, resample
from ..io.codefiles import CodeFile, write_codes
from ..model.config import CodecConfig
from ..progress import ProgressCallback

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".au", ".caf", ".w64", ".rf64")
ENCODE_CHUNK_SECONDS = 10.0


@dataclass
class Summary:
    """What one encode or decode did, for the one-line report."""

    label: str
    audio_seconds: float
    frames: int
    wall: float
    backend: str

    def line(self) -> str:
        speed = self.audio_seconds / self.wall if self.wall > 0 else float("inf")
        return (f"{self.label}: {self.audio_seconds:.2f} s audio, {self.frames} frames, {self.wall:.3f} s, "
                f"{speed:.1f}x real time, backend {self.backend}")


@dataclass
class Audio:
    samples: np.ndarray  # (n,) float32 at the model's rate once prepared
    rate: int
    channels: int
    path: Path


def read_input_audio(path: Path, allow_truncated: bool = False) -> Audio:
    x, rate, channels = read_audio(path, allow_truncated=allow_truncated)
    return Audio(x, rate, channels, path)


def to_model_rate(audio: Audio, cfg: CodecConfig, method: str) -> np.ndarray:
    if audio.rate == cfg.sample_rate:
        return audio.samples
    return resample(audio.samples, audio.rate, cfg.sample_rate, method)


def with_detail(progress: ProgressCallback | None, detail: str) -> ProgressCallback | None:
    """``progress`` with ``detail`` (a file name) filled into reports that carry none."""
    if progress is None or not detail:
        return progress
    return lambda p: progress(p if p.detail else replace(p, detail=detail))


def run_encode(codec: Codec, x: np.ndarray, pad_to: str, progress: ProgressCallback | None = None,
               detail: str = "") -> np.ndarray:
    """One-shot encode, or the chunked one (same codes) past the one-shot length limit.
    ``progress`` gets the codec's "encode" reports, with ``detail`` (the file name)."""
    progress = with_detail(progress, detail)
    if x.shape[0] > MAX_ENCODE_SECONDS * codec.config.sample_rate and hasattr(codec, "encode_chunked"):
        return codec.encode_chunked(x, chunk_seconds=ENCODE_CHUNK_SECONDS, pad_to=pad_to, progress=progress)
    return codec.encode(x, pad_to=pad_to, progress=progress)


def encode_file(codec: Codec, audio: Audio, dst: Path, *, sha: str, pad_to: str = "code_frame",
                resample_method: str = "soxr", transcript: str | None = None,
                progress: ProgressCallback | None = None) -> Summary:
    """Encode ``audio`` and write its code file to ``dst`` (atomically; the format follows the
    extension). ``sha``: the model file's sha256, recorded in the file. ``progress``: see
    :func:`run_encode`."""
    cfg = codec.config
    x = to_model_rate(audio, cfg, resample_method)
    start = time.perf_counter()
    codes = run_encode(codec, x, pad_to, progress, audio.path.name)
    wall = time.perf_counter() - start
    meta = {"pad_to": pad_to, "model_sha256": sha, "library_version": __version__,
            "codebook_sizes": cfg.quantizer.codebook_sizes, "samples_per_frame": cfg.samples_per_frame}
    write_codes(dst, CodeFile(codes, sample_rate=cfg.sample_rate, n_samples=int(x.shape[0]),
                              transcript=transcript, meta=meta))
    return Summary(f"encoded {audio.path} -> {dst}", x.shape[0] / cfg.sample_rate, codes.shape[1], wall, codec.backend_name)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def walk(root: Path, extensions: Iterable[str]) -> list[Path]:
    """Files under ``root`` whose extension is one of ``extensions``, sorted, hidden ones skipped."""
    exts = {e.lower() for e in extensions}
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(folder) / f for f in sorted(files) if not f.startswith(".") and Path(f).suffix.lower() in exts]
    return found


def plan_batch(src_root: Path, dst_root: Path, extensions: Iterable[str], out_ext: str,
               force: bool) -> tuple[list[tuple[Path, Path]], list[Path], list[tuple[Path, str]]]:
    """(work pairs, skipped existing outputs, failures) for mirroring ``src_root`` into ``dst_root``."""
    if dst_root.exists() and not dst_root.is_dir():
        raise ValueError(f"{dst_root}: output must be a directory when the input is one")
    work, skipped, failed, seen = [], [], [], {}
    for src in walk(src_root, extensions):
        dst = dst_root / src.relative_to(src_root).with_suffix(out_ext)
        if dst in seen:
            failed.append((src, f"output {dst} also comes from {seen[dst]}"))
            continue
        seen[dst] = src
        if dst.exists() and not force:
            skipped.append(dst)
        else:
            work.append((src, dst))
    return work, skipped, failed
