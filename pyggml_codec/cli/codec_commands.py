"""The codec commands of the CLI: encode, decode, roundtrip, for one file or a directory tree.

Every check that needs no model (paths, extensions, option combinations, existing outputs,
unreadable inputs in single-file mode) runs before the model is loaded. Outputs are written
atomically. In directory mode a bad file is reported and skipped; the command then exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..api import load
from ..io.audio import SUBTYPES, audio_format, write_audio
from ..codec import Codec
from ..io.codefiles import EXTENSIONS as CODE_EXTENSIONS
from ..io.codefiles import CodeFile, encode_transcript, format_of, read_codes
from ..model.config import CodecConfig
from ..errors import CodecError, CodeFileError, InputError
from ..inputs import MAX_DECODE_FRAMES
from ..progress import ProgressCallback
from ..progress import report as send
from ..dataset.corpus import (  # noqa: F401  (AUDIO_EXTENSIONS, file_sha256, to_model_rate: part of this module's face)
    AUDIO_EXTENSIONS, Audio, Summary, encode_file, file_sha256, plan_batch, read_input_audio, run_encode, to_model_rate,
    walk, with_detail,
)
from .progress import Bars, bars_for, progress_enabled  # noqa: F401  (progress_enabled: part of this module's face)

USER_ERRORS = (CodecError, OSError, ValueError, ImportError)
DECODE_CHUNK_FRAMES = 256  # chunk length for inputs past the one-shot limit (exact: stateful stream)


class CliError(Exception):
    """A user error: printed as one line; ``status`` 2 for usage, 1 otherwise."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def report(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr)


# --------------------------------------------------------------------------- checks


def check_model_path(path: Path) -> None:
    """The model (or quantize/convert source) exists and is a file: one message per case, for
    every command."""
    if not path.exists():
        raise CliError(f"{path}: no such model file")
    if not path.is_file():
        raise CliError(f"{path}: the model is a directory, not a GGUF file")


def check_parent(path: Path) -> None:
    """The folder ``path`` goes in exists: the CLI never creates missing folders above an output."""
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "no such directory"
        raise CliError(f"{parent}: {what} (for the output {path.name}; create it first)")


def check_output(path: Path, force: bool) -> None:
    """Refuse to overwrite without --force, to write over a directory, or into a missing folder."""
    if path.is_dir():
        raise CliError(f"{path}: output is a directory")
    if path.exists() and not force:
        raise CliError(f"{path} exists (use --force to overwrite)")
    check_parent(path)


def check_output_dir(path: Path, file_extensions) -> None:
    """Directory mode's output: a directory (made if missing, in an existing folder), not a name
    that reads as one output file."""
    if path.exists() and not path.is_dir():
        raise CliError(f"{path}: output must be a directory when the input is one")
    if not path.exists():
        if path.suffix.lower() in {e.lower() for e in file_extensions}:
            raise CliError(f"{path}: the input is a directory, so the output is a directory of files; "
                           f"name a directory, not a {path.suffix} file", status=2)
        check_parent(path)


def check_input(path: Path) -> None:
    if not path.exists():
        raise CliError(f"{path}: no such file or directory")


def check_code_extension(path: Path, what: str = "output") -> str:
    if path.suffix.lower() not in CODE_EXTENSIONS:
        raise CliError(f"{path}: {what} must end in one of {', '.join(CODE_EXTENSIONS)}", status=2)
    return format_of(path)


def check_audio_extension(path: Path, subtype: str) -> None:
    """A usage error for an output extension libsndfile does not know, or whose format cannot hold
    ``subtype`` (.ogg and .mp3 hold only their own compressed samples): found before any loading."""
    import soundfile as sf

    try:
        fmt = audio_format(path)
    except ValueError:
        raise CliError(f"{path}: audio output must end in .wav, .flac or another libsndfile extension", status=2) from None
    if not sf.check_format(fmt, SUBTYPES[subtype]):
        raise CliError(f"{path}: {fmt} files cannot hold {SUBTYPES[subtype]} samples; write .wav, .flac or .aiff",
                       status=2)


def check_transcript(args: argparse.Namespace, kind: str) -> None:
    if args.transcript is not None and kind == "npy":
        raise CliError("--transcript needs a .s2voice or .npz output (.npy holds only the codes)", status=2)
    if args.transcript is not None:
        try:
            encode_transcript(args.transcript, "--transcript")
        except CodeFileError as exc:
            raise CliError(str(exc), status=2) from None
    if kind == "s2voice" and not args.transcript:
        # s2.cpp clones a voice from a profile only together with its reference text
        print(f"pyggml-codec: warning: {args.output} gets no transcript, and s2.cpp uses a voice profile for "
              "cloning only with the text its audio speaks: add --transcript \"...\"", file=sys.stderr)


# --------------------------------------------------------------------------- model


def load_codec(args: argparse.Namespace, parts: str) -> Codec:
    return load(args.model, backend=args.backend, device=args.device, n_threads=args.threads,
                precision=args.precision, parts=parts, strict_backend=args.strict_backend)


def check_compatible(cf: CodeFile, cfg: CodecConfig, path: Path) -> None:
    """The code file was made for a model of this layout (count, sizes, rate, frame)."""
    if cf.n_codebooks != cfg.n_codebooks:
        raise CliError(f"{path}: {cf.n_codebooks} codebooks, the model has {cfg.n_codebooks}")
    if cf.sample_rate is not None and cf.sample_rate != cfg.sample_rate:
        raise CliError(f"{path}: codes are for {cf.sample_rate} Hz, the model runs at {cfg.sample_rate} Hz")
    sizes = cf.meta.get("codebook_sizes")
    if sizes is not None and tuple(sizes) != cfg.quantizer.codebook_sizes:
        raise CliError(f"{path}: codebook sizes {list(sizes)} differ from the model's {list(cfg.quantizer.codebook_sizes)}")
    spf = cf.meta.get("samples_per_frame")
    if spf is not None and spf != cfg.samples_per_frame:
        raise CliError(f"{path}: {spf} samples per frame, the model has {cfg.samples_per_frame}")


def run_decode(codec: Codec, codes: np.ndarray, progress: ProgressCallback | None = None,
               detail: str = "") -> np.ndarray:
    """One-shot decode (the codec reports its "decode" progress), or the exact stream decoder
    past the one-shot frame limit on a backend without chunked decode (reported per chunk)."""
    n = codes.shape[1]
    progress = with_detail(progress, detail)
    if n <= MAX_DECODE_FRAMES or not hasattr(codec, "stream_decoder"):
        return codec.decode(codes, progress=progress)
    parts = []
    with codec.stream_decoder() as sd:
        for i in range(0, n, DECODE_CHUNK_FRAMES):
            parts.append(sd.push(codes[:, i:i + DECODE_CHUNK_FRAMES]))
            send(progress, "decode", min(i + DECODE_CHUNK_FRAMES, n), n, "frames")
    return np.concatenate(parts)


# --------------------------------------------------------------------------- one file


def _named(path: Path, exc: InputError) -> CliError:
    """A library input error (NaN samples, empty codes) as a CLI error naming its file."""
    return CliError(f"{path}: {exc}")


def encode_audio(codec: Codec, audio: Audio, dst: Path, args: argparse.Namespace, sha: str,
                 progress: ProgressCallback | None = None) -> Summary:
    try:
        return encode_file(codec, audio, dst, sha=sha, pad_to=args.pad_to, resample_method=args.resample,
                           transcript=args.transcript, progress=progress)
    except InputError as exc:
        raise _named(audio.path, exc) from None


def decode_codes(codec: Codec, cf: CodeFile, src: Path, dst: Path, args: argparse.Namespace,
                 progress: ProgressCallback | None = None) -> Summary:
    cfg = codec.config
    check_compatible(cf, cfg, src)
    start = time.perf_counter()
    try:
        wave = run_decode(codec, cf.codes, progress, src.name)
    except InputError as exc:
        raise _named(src, exc) from None
    wall = time.perf_counter() - start
    if cf.n_samples is not None and not args.no_trim:
        wave = wave[: cf.n_samples]
    write_audio(dst, wave, cfg.sample_rate, subtype=args.subtype)
    return Summary(f"decoded {src} -> {dst}", wave.shape[0] / cfg.sample_rate, cf.n_frames, wall, codec.backend_name)


# --------------------------------------------------------------------------- directory mode


def run_batch(args: argparse.Namespace, plan, parts: str, one: Callable[[Codec, Path, Path], Summary]) -> int:
    """Directory mode: one bar for the files and one for the audio hours (none per file)."""
    work, skipped, failed = plan
    total_files = len(work) + len(failed)
    if skipped:
        report(args, f"skipping {len(skipped)} existing output(s) (use --force to overwrite)")
    summaries: list[Summary] = []
    if work:
        with load_codec(args, parts) as codec, bars_for(args) as bars:
            seconds = 0.0
            for i, (src, dst) in enumerate(work):
                try:
                    summaries.append(one(codec, src, dst))
                    seconds += summaries[-1].audio_seconds
                    if args.verbose and not args.quiet:
                        bars.note(summaries[-1].line())
                except (*USER_ERRORS, CliError) as exc:
                    failed.append((src, str(exc)))
                send(bars, "corpus", i + 1, len(work), "files", src.name)
                send(bars, "corpus audio", seconds / 3600, None, "h")
            backend = codec.backend_name
        if summaries:
            total = Summary(f"{len(summaries)} file(s)", sum(s.audio_seconds for s in summaries),
                            sum(s.frames for s in summaries), sum(s.wall for s in summaries), backend)
            report(args, total.line())
    if not work and not failed:
        report(args, "nothing to do")
    for src, reason in failed:
        print(f"pyggml-codec: error: {reason if str(src) in reason else f'{src}: {reason}'}", file=sys.stderr)
    if failed:
        print(f"pyggml-codec: error: {len(failed)} of {total_files} file(s) failed", file=sys.stderr)
    return 1 if failed else 0


# --------------------------------------------------------------------------- commands


def _read(args: argparse.Namespace, path: Path) -> Audio:
    return read_input_audio(path, allow_truncated=args.allow_truncated)


def cmd_encode(args: argparse.Namespace) -> int:
    check_input(args.input)
    check_model_path(args.model)
    if getattr(args, "ray", None) is None and (getattr(args, "actors", 1) != 1 or getattr(args, "gpus_per_actor", 0)):
        raise CliError("--actors and --gpus-per-actor apply with --ray", status=2)
    if args.input.is_dir():
        if args.transcript is not None:
            raise CliError("--transcript applies to one file, not a directory", status=2)
        check_output_dir(args.output, CODE_EXTENSIONS)
    if getattr(args, "ray", None) is not None:
        if not args.input.is_dir():
            raise CliError("--ray encodes a directory (a corpus), not one file", status=2)
        return run_ray(args)
    if args.input.is_dir():
        plan = plan_batch(args.input, args.output, AUDIO_EXTENSIONS, "." + args.format, args.force)
        sha = file_sha256(args.model)
        return run_batch(args, plan, "encode",
                         lambda codec, src, dst: encode_audio(codec, _read(args, src), dst, args, sha))
    kind = check_code_extension(args.output)
    check_transcript(args, kind)
    check_output(args.output, args.force)
    audio = _read(args, args.input)
    sha = file_sha256(args.model)
    with load_codec(args, "encode") as codec:
        with bars_for(args) as bars:
            summary = encode_audio(codec, audio, args.output, args, sha, progress=bars)
        report(args, summary.line())
    return 0


def run_ray(args: argparse.Namespace) -> int:
    """``encode CORPUS -o OUT --ray [ADDRESS]``: the Ray Data corpus job; 1 when any file failed."""
    from ..dataset import CorpusJob, encode_corpus

    if args.allow_truncated:
        raise CliError("--allow-truncated does not apply with --ray", status=2)
    job = CorpusJob(args.input, args.output, args.model, fmt=args.format, pad_to=args.pad_to, resample=args.resample,
                    precision=args.precision, backend="cpu" if args.backend == "auto" and not args.gpus_per_actor else args.backend,
                    actors=args.actors, threads_per_actor=args.threads or 1, gpus_per_actor=args.gpus_per_actor,
                    force=args.force)
    with bars_for(args) as bars:
        def progress(p) -> None:
            bars(p)
            if p.task == "corpus" and args.verbose and not args.quiet:
                bars.note(f"[{p.done}/{p.total}] {p.detail}")

        result = encode_corpus(job, address=args.ray or None, progress=progress)
    for row in result.rows:
        if row["status"] == "failed":
            print(f"pyggml-codec: error: {row['error'] if row['path'] in row['error'] else row['path'] + ': ' + row['error']}",
                  file=sys.stderr)
    report(args, result.summary())
    return 1 if result.count("failed") else 0


def cmd_decode(args: argparse.Namespace) -> int:
    check_input(args.input)
    check_model_path(args.model)
    if args.input.is_dir():
        check_output_dir(args.output, [f".{ext.lower()}" for ext in _audio_extensions()])
        plan = plan_batch(args.input, args.output, CODE_EXTENSIONS, ".wav", args.force)
        return run_batch(args, plan, "decode",
                         lambda codec, src, dst: decode_codes(codec, read_codes(src), src, dst, args))
    check_code_extension(args.input, "input")
    check_audio_extension(args.output, args.subtype)
    check_output(args.output, args.force)
    cf = read_codes(args.input)
    with load_codec(args, "decode") as codec:
        with bars_for(args) as bars:
            summary = decode_codes(codec, cf, args.input, args.output, args, progress=bars)
        report(args, summary.line())
    return 0


def _audio_extensions() -> list[str]:
    import soundfile as sf

    return [*sf.available_formats(), "aif", "oga"]


def cmd_roundtrip(args: argparse.Namespace) -> int:
    check_input(args.input)
    check_model_path(args.model)
    if args.input.is_dir():
        raise CliError("roundtrip takes one audio file, not a directory", status=2)
    check_audio_extension(args.output, args.subtype)
    check_output(args.output, args.force)
    audio = _read(args, args.input)
    with load_codec(args, "all") as codec:
        cfg = codec.config
        x = to_model_rate(audio, cfg, args.resample)
        start = time.perf_counter()
        with bars_for(args) as bars:
            try:
                codes = run_encode(codec, x, args.pad_to, bars, args.input.name)
                wave = run_decode(codec, codes, bars, args.input.name)[: x.shape[0]]
            except InputError as exc:
                raise _named(args.input, exc) from None
        wall = time.perf_counter() - start
        write_audio(args.output, wave, cfg.sample_rate, subtype=args.subtype)
        report(args, Summary(f"roundtrip {args.input} -> {args.output}", x.shape[0] / cfg.sample_rate,
                             codes.shape[1], wall, codec.backend_name).line())
    return 0
