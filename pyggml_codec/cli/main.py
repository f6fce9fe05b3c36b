"""``pyggml-codec`` / ``python -m pyggml_codec``: the command line, a thin shell over the API.

    pyggml-codec encode IN.wav -m MODEL.gguf -o OUT.npz     (.npz, .npy or .s2voice)
    pyggml-codec decode IN.npz -m MODEL.gguf -o OUT.wav
    pyggml-codec roundtrip IN.wav -m MODEL.gguf -o OUT.wav
    pyggml-codec encode DIR -m MODEL.gguf -o OUTDIR          (mirrors the tree; decode too)
    pyggml-codec info MODEL.gguf [--json]
    pyggml-codec convert SRC.pth OUT.gguf | convert --extract MERGED.gguf OUT.gguf
    pyggml-codec quantize IN.gguf OUT.gguf --type q8_0      (or q6_k)
    pyggml-codec backends [--json]
    pyggml-codec doctor [--json]                            (ggml build, kernels, BLAS)
    pyggml-codec demo                                       (no model needed)

Exit status: 0 success, 1 error (bad or missing file, failed run, any failure in
directory mode), 2 usage error. Errors are one line on stderr, ``pyggml-codec: error: ...``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path

from .._version import __version__
from . import fetch as fetch_cli
from .codec_commands import USER_ERRORS, CliError, check_model_path, check_output, cmd_decode, cmd_encode, cmd_roundtrip
from .inspect import cmd_backends, cmd_doctor, cmd_info
from .progress import add_progress_option, bars_for
from ..inputs import PAD_POLICIES
from ..plan import PRECISIONS
from ..io.codefiles import EXTENSIONS as CODE_EXTENSIONS
from ..io.fileio import atomic_path
from ..backend.runtime import BACKEND_NAMES

PROG = "pyggml-codec"


def _int_at_least(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def _thread_count(text: str) -> int:
    from ..backend.runtime import MAX_THREADS

    value = _positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_THREADS} threads (ggml's most), got {value}")
    return value


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "a non-negative integer")


def _demo_seconds(text: str) -> float:
    """The demo's signal length: at least one sample, at most one encode's limit (checked before any file
    is written; past it the demo would fail after writing its model and input)."""
    from ..demo import demo_config
    from ..inputs import MAX_ENCODE_SECONDS

    value = _positive_float(text)
    rate = demo_config().sample_rate
    if round(value * rate) < 1 or value > MAX_ENCODE_SECONDS:
        raise argparse.ArgumentTypeError(f"expected {1 / rate:.2g} to {MAX_ENCODE_SECONDS:g} seconds, got {text}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _common_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("output")
    g.add_argument("-q", "--quiet", action="store_true", help="no summary or progress (errors and warnings stay)")
    g.add_argument("-v", "--verbose", action="count", default=0,
                   help="per-file lines and library logs; -vv: tracebacks (default: neither)")
    return p


def _progress_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_progress_option(p.add_argument_group("progress"))
    return p


def _backend_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("backend")
    g.add_argument("--backend", choices=BACKEND_NAMES, default="auto",
                   help="ggml backend (default: %(default)s, a GPU if any)")
    g.add_argument("--device", type=_non_negative_int, default=0,
                   help="device index within the backend (default: %(default)s)")
    g.add_argument("--threads", type=_thread_count, default=None, help="CPU threads (default: usable cores)")
    g.add_argument("--precision", choices=PRECISIONS, default="f32",
                   help="f32 (exact reference) or s2cpp (F16 conv inputs, as the C++ engine) (default: %(default)s)")
    g.add_argument("--strict-backend", action="store_true", help="fail instead of falling back to CPU")
    return p


def _pad_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pad-to", choices=PAD_POLICIES, default="code_frame",
                   help="encode padding: code_frame (upstream) or frame_length (C++ engine) (default: %(default)s)")


def _force_option(p: argparse.ArgumentParser, what: str = "existing outputs") -> None:
    p.add_argument("--force", action="store_true", help=f"overwrite {what}")


def _model_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-m", "--model", type=Path, required=True, help="codec GGUF (fish-speech-codec or merged fish-speech)")
    return p


def _audio_options(p: argparse.ArgumentParser, reads: bool, writes: bool) -> None:
    if reads:
        p.add_argument("--resample", choices=("soxr", "linear"), default="soxr",
                       help="for input not at the model's rate: soxr (high quality) or linear (C++ engine) "
                            "(default: %(default)s)")
        p.add_argument("--allow-truncated", action="store_true",
                       help="encode what a truncated audio file holds, with a warning, instead of refusing it")
        _pad_option(p)
    if writes:
        p.add_argument("--subtype", choices=("float", "pcm16"), default="float",
                       help="output samples: 32-bit float or 16-bit PCM (default: %(default)s)")
    _force_option(p)


def _add_codec_commands(sub, parents: list) -> None:
    enc = sub.add_parser("encode", parents=parents, help="audio file (or directory) -> code file(s)",
                         description="Encode audio to codes. Output kind by extension: " + ", ".join(CODE_EXTENSIONS)
                         + "; a directory is mirrored into an output directory, one code file per audio file.")
    enc.add_argument("input", type=Path, help="audio file (any libsndfile format) or a directory of them")
    enc.add_argument("-o", "--output", type=Path, required=True, help="code file, or a directory in directory mode")
    enc.add_argument("--transcript", default=None, help="text stored with the codes (.s2voice, .npz)")
    enc.add_argument("--format", choices=("npz", "npy", "s2voice"), default="npz",
                     help="directory mode output kind (default: %(default)s)")
    ray = enc.add_argument_group("corpus on Ray Data (directory mode; pip install 'pyggml_codec[ray]')")
    ray.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                     help="encode the directory on Ray: a local Ray without ADDRESS, else join the cluster there "
                          "(write --ray=ADDRESS before the input); writes OUTDIR/manifest.parquet; one job per OUTDIR")
    ray.add_argument("--actors", type=_positive_int, default=1,
                     help="actors, each holding one codec with --threads CPU threads (default: %(default)s actor, "
                          "1 thread)")
    ray.add_argument("--gpus-per-actor", type=float, default=0.0,
                     help="GPUs per actor, with --backend cuda etc. (default: %(default)s)")
    _audio_options(enc, reads=True, writes=False)
    enc.set_defaults(func=cmd_encode)

    dec = sub.add_parser("decode", parents=parents, help="code file (or directory) -> audio file(s)",
                         description="Decode codes to audio at the model's rate, trimmed to the original length "
                         "when the code file records it; a directory is mirrored into an output directory.")
    dec.add_argument("input", type=Path, help="code file (.npz, .npy, .s2voice) or a directory of them")
    dec.add_argument("-o", "--output", type=Path, required=True, help="audio file (.wav, .flac, ...) or a directory")
    dec.add_argument("--no-trim", action="store_true", help="keep the padding of the last code frame")
    _audio_options(dec, reads=False, writes=True)
    dec.set_defaults(func=cmd_decode)

    rt = sub.add_parser("roundtrip", parents=parents, help="audio -> codes -> audio",
                        description="Encode and decode one file; the output is trimmed to the input length.")
    rt.add_argument("input", type=Path, help="audio file")
    rt.add_argument("-o", "--output", type=Path, required=True, help="audio file to write")
    _audio_options(rt, reads=True, writes=True)
    rt.set_defaults(func=cmd_roundtrip)


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON to stdout instead of text")


def _add_tool_commands(sub, common, backend, progress) -> None:
    info = sub.add_parser("info", parents=[common], help="describe a codec GGUF (no weights loaded)",
                          description="Describe a codec GGUF: configuration, tensors, bytes per part, dtypes, "
                                      "quantization, and whether it loads. Reads the header only. Exit 1 when "
                                      "the file would not load.")
    info.add_argument("model_file", type=Path, metavar="MODEL.gguf", help="codec GGUF, merged or codec-only")
    _json_flag(info)
    info.set_defaults(func=cmd_info)

    be = sub.add_parser("backends", parents=[common], help="list ggml backends and devices",
                        description="List the ggml backends of this build and their devices, with memory.")
    _json_flag(be)
    be.set_defaults(func=cmd_backends)

    doc = sub.add_parser("doctor", parents=[common], help="what this install runs: ggml build, kernels, BLAS",
                         description="Show what this install runs: the ggml build, the compiled CPU kernels, the "
                                     "BLAS, and whether precision s2cpp can be bit-exact. Exit 1 when it warns.")
    _json_flag(doc)
    doc.set_defaults(func=cmd_doctor)

    from ..model.convert import add_convert_arguments

    conv = sub.add_parser("convert", parents=[common, progress],
                          help="upstream checkpoint -> GGUF, or extract from a merged GGUF",
                          description="Convert an upstream fish-speech codec checkpoint (.pth) to a codec GGUF, or "
                                      "with --extract copy the codec out of a merged fish-speech GGUF unchanged.")
    add_convert_arguments(conv)
    _force_option(conv, "OUT")
    conv.set_defaults(func=cmd_convert)

    quant = sub.add_parser("quantize", parents=[common, progress],
                           help="rewrite a codec GGUF with its matrices quantized (Q8_0, Q6_K)",
                           description="Rewrite a codec GGUF with its transformer and pointwise matrices in a "
                                       "quantized type; convolutions, norms and codebooks stay as stored.")
    quant.add_argument("src", type=Path, metavar="IN.gguf", help="codec GGUF (F16 or F32; merged or codec-only)")
    quant.add_argument("out", type=Path, metavar="OUT.gguf", help="quantized file to write")
    quant.add_argument("--type", dest="qtype", default="q8_0", metavar="TYPE",
                       help="q8_0 or q6_k (q5_k, q4_k: measured and rejected, see the README) (default: %(default)s)")
    quant.add_argument("--keep", action="append", default=[], metavar="GLOB",
                       help="leave matrices whose file name matches as stored (repeatable; default: none)")
    _force_option(quant, "OUT")
    quant.set_defaults(func=cmd_quantize)

    demo = sub.add_parser("demo", parents=[common, backend], help="run a tiny random-weight model (no files needed)",
                          description="Build a tiny model with random weights, encode and decode a generated "
                                      "signal, and write the files: a check that the install runs, no model needed.")
    demo.add_argument("-o", "--output-dir", type=Path, default=None, help="where to write (default: a new temp folder)")
    demo.add_argument("--seconds", type=_demo_seconds, default=2.0,
                      help="length of the test signal, up to 120 s (default: %(default)s)")
    demo.add_argument("--seed", type=_non_negative_int, default=0, help="random weights seed (default: %(default)s)")
    _pad_option(demo)
    _force_option(demo, "the demo files")
    demo.set_defaults(func=cmd_demo)


def _add_diagnostics(sub, common: argparse.ArgumentParser) -> None:
    """The diagnostics commands (``cli/diagnostics.py``: compare, bench-backends), imported by
    name so that a broken diagnostics module (or one of its imports) only costs those commands,
    never encode and decode."""
    name = f"{__package__}.diagnostics"
    try:
        diagnostics = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return
        print(f"{PROG}: warning: diagnostics commands unavailable ({exc})", file=sys.stderr)
        return
    except Exception as exc:  # noqa: BLE001 - a broken optional module must not take encode/decode down
        print(f"{PROG}: warning: diagnostics commands unavailable ({type(exc).__name__}: {exc})", file=sys.stderr)
        return
    if hasattr(diagnostics, "register_cli"):
        diagnostics.register_cli(sub, parents=[common])


def get_parser() -> argparse.ArgumentParser:
    common, backend, model, progress = _common_parent(), _backend_parent(), _model_parent(), _progress_parent()
    parser = argparse.ArgumentParser(prog=PROG, description="The Fish Audio S2 Pro codec on ggml.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_codec_commands(sub, [common, model, progress, backend])
    _add_tool_commands(sub, common, backend, progress)
    fetch_cli.register_cli(sub, common, progress)
    _add_diagnostics(sub, common)
    return parser


# --------------------------------------------------------------------------- commands defined here


def cmd_convert(args: argparse.Namespace) -> int:
    from ..model.convert import run_convert

    out = Path(args.out)
    check_output(out, args.force)
    with atomic_path(out) as tmp, bars_for(args) as bars:
        args.out = tmp
        try:
            run_convert(args, progress=bars)
        finally:
            args.out = out
    if not args.quiet:
        print(out)
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from ..model.quantize import parse_type, quantize_file

    try:
        parse_type(args.qtype)  # an unknown --type fails before anything is read
    except ValueError as exc:
        raise CliError(f"--type: {exc}", status=2) from None
    check_model_path(args.src)
    check_output(args.out, args.force)
    if args.out.resolve() == args.src.resolve():
        raise CliError("OUT must differ from IN")
    with atomic_path(args.out) as tmp, bars_for(args) as bars:
        report = quantize_file(args.src, tmp, args.qtype, tuple(args.keep), progress=bars)
    report.output = str(args.out)
    if not args.quiet:
        print(report.summary())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    lines = run_demo(args)
    if not args.quiet:
        print("\n".join(lines))
    return 0


# --------------------------------------------------------------------------- main


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).removeprefix("pyggml_codec: ")
    print(f"{PROG}: warning: {text}", file=sys.stderr)


def _setup_logging(verbose: int) -> None:
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
        log = logging.getLogger("pyggml_codec")
        log.addHandler(handler)
        log.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (argparse usage errors exit 2 directly)."""
    args = get_parser().parse_args(argv)
    verbose = getattr(args, "verbose", 0)
    args.quiet = getattr(args, "quiet", False)
    _setup_logging(verbose)
    previous = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit: a reader that went away is then caught below
        return status
    except BrokenPipeError as exc:
        if not _stdout_gone():  # another pipe (a child's, a socket): an error like any other
            return _fail(str(exc), 1, verbose)
        _silence_stdout()  # the reader of stdout went away (``info | head``): no one to tell
        return 141
    except CliError as exc:
        return _fail(str(exc), exc.status, verbose)
    except USER_ERRORS as exc:
        return _fail(str(exc) or type(exc).__name__, 1, verbose)
    except KeyboardInterrupt:
        return _fail("interrupted", 130, verbose)
    finally:
        warnings.showwarning = previous


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on its write end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # pragma: no cover - no poll() or no file behind stdout
        return True


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail on the closed pipe."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError):  # pragma: no cover - stdout not a real file
        pass


def _fail(message: str, status: int, verbose: int) -> int:
    if verbose > 1:
        traceback.print_exc()
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
