"""The diagnostics commands: ``compare`` (two dumps, code files or audio files, stage by stage),
``bench-backends`` (the same decode and encode on every backend of this build) and
``s2cpp-compare`` (this library's s2cpp precision against the user's own s2.cpp build)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..errors import CodecError
from ..io.fileio import atomic_path
from ..diagnostics.compare import CompareUsageError, compare

PROG = "pyggml-codec"
REPORT_HELP = "also write a self-contained HTML page with plots (needs pip install 'pyggml_codec[plot]')"


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def _positive(text: str) -> float:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number > 0, got 0")
    return value


def _json_options(p: argparse.ArgumentParser, what: str) -> None:
    """``--json`` (print JSON to stdout, as in every command) and ``--json-out FILE``; ``--json FILE``,
    the spelling of earlier releases, still writes FILE."""
    p.add_argument("--json", nargs="?", const=True, default=None, metavar="FILE",
                   help=f"print the {what} as JSON to stdout instead of the table (--json FILE, the earlier "
                        "spelling, writes FILE as --json-out does; put it after the positional arguments)")
    p.add_argument("--json-out", type=Path, default=None, metavar="FILE",
                   help=f"also write the {what} as JSON to FILE (default: no file)")


def register_cli(subparsers, parents: list | tuple = ()) -> None:
    """Add ``compare``, ``bench-backends`` and ``s2cpp-compare`` to an argparse ``_SubParsersAction``;
    ``parents``: the CLI's common options (``-q``, ``-v``)."""
    parents = list(parents)
    cmp_ = subparsers.add_parser(
        "compare", parents=parents, help="compare two dumps, code files or audio files stage by stage",
        description="Compare B against the reference A. Exit 0 within tolerance, 1 past it "
                    "(or an unreadable file), 2 for a usage error (e.g. files of different kinds).")
    cmp_.add_argument("a", type=Path, metavar="A", help="reference: dump .npz, code file, or audio file")
    cmp_.add_argument("b", type=Path, metavar="B", help="the same kind of file as A")
    cmp_.add_argument("--rel-rms", type=_non_negative, default=None, help="float-stage tolerance (default 1e-3)")
    cmp_.add_argument("--max-abs", type=_non_negative, default=None, help="also limit max |A-B| (default: unchecked)")
    cmp_.add_argument("--agreement", type=_non_negative, default=None,
                      help="least fraction of equal codes per codebook (default 1.0)")
    _json_options(cmp_, "report")
    cmp_.add_argument("--report", type=Path, default=None, metavar="HTML", help=REPORT_HELP)
    cmp_.add_argument("--brief", action="store_true",
                      help="print only the verdict line (what -q printed in 0.1; -q now prints nothing)")
    cmp_.set_defaults(func=cmd_compare)

    bench = subparsers.add_parser(
        "bench-backends", parents=parents, help="time decode and encode on every available backend",
        description="Run the same decode and encode on each backend of this ggml build: cold call "
                    "(graph build + first compute), warm median, compute memory, lowerings, and "
                    "deltas against the CPU result.")
    bench.add_argument("-m", "--model", type=Path, required=True, help="codec GGUF")
    bench.add_argument("--seconds", type=_positive, default=2.0, help="test signal length (default: %(default)s)")
    bench.add_argument("--repeats", type=int, default=3, help="warm runs per measurement, median (default: %(default)s)")
    bench.add_argument("--precision", choices=("f32", "s2cpp"), default="f32", help="codec precision (default: %(default)s)")
    bench.add_argument("--threads", type=int, default=None, help="CPU threads (default: usable cores)")
    _json_options(bench, "results")
    bench.add_argument("--report", type=Path, default=None, metavar="HTML", help=REPORT_HELP)
    bench.set_defaults(func=cmd_bench_backends)

    s2 = subparsers.add_parser(
        "s2cpp-compare", parents=parents, help="compare the s2cpp precision with your s2.cpp build, stage by stage",
        description="Build this package's harness against an s2.cpp source tree (cached), run s2.cpp's "
                    "codec and this library (precision s2cpp, CPU) on the same codes and audio, and "
                    "compare every stage bit for bit, s2.cpp as the reference. Exit 0 when identical, "
                    "1 when a stage differs (the first is named) or the comparison cannot run.")
    s2.add_argument("s2cpp", type=Path, metavar="S2CPP_DIR", help="an s2.cpp checkout with its ggml submodule")
    s2.add_argument("-m", "--model", type=Path, required=True, help="an F16 codec GGUF that s2.cpp loads")
    s2.add_argument("--frames", type=int, default=16, help="length of the generated test input (default: %(default)s)")
    s2.add_argument("--codes", type=Path, default=None, help="decode these codes (a code file) instead")
    s2.add_argument("--audio", type=Path, default=None, help="encode this audio file instead")
    s2.add_argument("--only", choices=("decode", "encode"), default=None, help="one direction only (default: both)")
    s2.add_argument("--threads", type=int, default=None, help="CPU threads on both sides (default: usable cores)")
    s2.add_argument("--cmake-arg", action="append", default=[], metavar="ARG",
                    help="passed to the harness's cmake configure, e.g. --cmake-arg=-DGGML_NATIVE=OFF "
                         "(repeatable; default: none)")
    s2.add_argument("--build-dir", type=Path, default=None, help="harness build folder (default: a cache)")
    _json_options(s2, "reports")
    s2.add_argument("--report", type=Path, default=None, metavar="HTML", help=REPORT_HELP)
    s2.set_defaults(func=cmd_s2cpp_compare)


def _json_stdout(args: argparse.Namespace) -> bool:
    return args.json is True


def _json_file(args: argparse.Namespace) -> Path | None:
    """``--json-out FILE``, or ``--json FILE`` (the earlier spelling); both given is a usage error."""
    legacy = Path(args.json) if isinstance(args.json, str) else None
    if legacy is not None and args.json_out is not None:
        raise _Usage("--json FILE and --json-out FILE both name a file; use --json-out")
    return args.json_out if args.json_out is not None else legacy


class _Usage(Exception):
    pass


def _say(args: argparse.Namespace, text: str) -> None:
    """Print ``text`` unless ``-q``."""
    if not getattr(args, "quiet", False):
        print(text)


def _error(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def _tolerances_from(args: argparse.Namespace) -> dict[str, float]:
    names = {"rel_rms": args.rel_rms, "max_abs": args.max_abs, "agreement": args.agreement}
    return {k: v for k, v in names.items() if v is not None}


def cmd_compare(args: argparse.Namespace) -> int:
    """``compare A B``: print the table; 0 within tolerance, 1 past it or unreadable, 2 usage."""
    try:
        json_file = _json_file(args)
    except _Usage as exc:
        return _error(str(exc), 2)
    for p in (args.a, args.b):
        if not Path(p).is_file():
            return _error(f"{p}: no such file", 1)
    try:
        _check_report(args)
        report = compare(args.a, args.b, _tolerances_from(args))
    except CompareUsageError as exc:
        return _error(str(exc), 2)
    except (CodecError, OSError, ValueError) as exc:
        return _error(str(exc) or type(exc).__name__, 1)
    _say(args, report.to_json() if _json_stdout(args) else report.verdict() if args.brief else report.table())
    if not _write_json(json_file, report.to_json) or not _write_report(
            args, lambda page: page.compare_page(report, args.a, args.b)):
        return 1
    return 0 if report.ok else 1


def cmd_bench_backends(args: argparse.Namespace) -> int:
    """``bench-backends -m MODEL``: print the table (and write JSON); 0 when every backend ran."""
    from ..diagnostics.bench import bench_backends

    try:
        json_file = _json_file(args)
    except _Usage as exc:
        return _error(str(exc), 2)
    if args.repeats < 1:
        return _error(f"--repeats must be >= 1, got {args.repeats}", 2)
    if not _model_ok(args.model):
        return 1
    try:
        _check_report(args)
        result = bench_backends(args.model, seconds=args.seconds, repeats=args.repeats,
                                precision=args.precision, n_threads=args.threads)
    except (CodecError, OSError, ValueError) as exc:
        return _error(str(exc) or type(exc).__name__, 1)
    _say(args, result.to_json() if _json_stdout(args) else result.table())
    if not _write_json(json_file, result.to_json) or not _write_report(args, lambda page: page.bench_page(result)):
        return 1
    return 0 if result.ok else 1


def _model_ok(path: Path) -> bool:
    """The model file check every command shares (codec_commands.check_model_path); False with
    the error printed."""
    from .codec_commands import CliError, check_model_path

    try:
        check_model_path(Path(path))
    except CliError as exc:
        _error(str(exc), 1)
        return False
    return True


def _write_json(path: Path | None, to_json) -> bool:
    """Write ``to_json()`` to ``path`` (``--json-out``, if given); False (error printed) when it cannot."""
    if path is None:
        return True
    try:
        _write_text(path, to_json())
    except OSError as exc:
        _error(f"{path}: cannot write ({exc.strerror or exc})", 1)
        return False
    return True


def _check_report(args: argparse.Namespace) -> None:
    """``--report`` without matplotlib fails here, before any long work (PlotExtraMissing, exit 1)."""
    if getattr(args, "report", None) is not None:
        from ..diagnostics.report import require_plotting

        require_plotting()


def _write_report(args: argparse.Namespace, build) -> bool:
    """Write ``build(report_module)`` to ``--report`` (if given); False (error printed) when it cannot."""
    if getattr(args, "report", None) is None:
        return True
    from ..diagnostics import report as page

    try:
        page.write_page(args.report, build(page))
    except OSError as exc:
        _error(f"{args.report}: cannot write ({exc.strerror or exc})", 1)
        return False
    return True


def _write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n")


def _s2cpp_inputs(args: argparse.Namespace, codec):
    """{"decode": codes, "encode": audio} for ``s2cpp-compare``: the user's files or a fixed signal."""
    import numpy as np

    from ..inputs import check_audio
    from ..io.audio import read_audio
    from ..io.codefiles import read_codes

    rng = np.random.default_rng(0)
    n = args.frames
    codes = (read_codes(args.codes).codes if args.codes else
             np.stack([rng.integers(0, s, n) for s in codec.config.quantizer.codebook_sizes]).astype(np.int32))
    if args.audio:  # mono, at the codec's rate (resampled as encode would): both engines get these samples
        samples, rate, _ = read_audio(args.audio)
        audio = check_audio(samples, codec.config, rate, None)
    else:
        t = np.arange(n * codec.config.samples_per_frame - 300) / codec.sample_rate
        audio = (0.3 * np.sin(2 * np.pi * 180 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    wanted = [args.only] if args.only else ["decode", "encode"]
    return {k: v for k, v in (("decode", codes), ("encode", audio)) if k in wanted}


def cmd_s2cpp_compare(args: argparse.Namespace) -> int:
    """``s2cpp-compare S2CPP_DIR -m MODEL``: 0 when every stage is identical, 1 otherwise."""
    import json
    import warnings

    from ..api import load
    from ..diagnostics import s2cpp

    try:
        json_file = _json_file(args)
    except _Usage as exc:
        return _error(str(exc), 2)
    if args.frames < 1 or (args.threads is not None and args.threads < 1):
        return _error("--frames and --threads must be >= 1", 2)
    if not _model_ok(args.model):
        return 1
    text = sys.stderr if _json_stdout(args) else sys.stdout  # stdout holds only the JSON with --json
    try:
        _check_report(args)
        s2cpp.check_model_for_s2cpp(args.model)
        exe = s2cpp.build_harness(args.s2cpp, args.build_dir, args.cmake_arg)
        info = s2cpp.harness_info(exe)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            codec = load(args.model, backend="cpu", precision="s2cpp", n_threads=args.threads)
        for w in caught:
            print(f"{PROG}: warning: {w.message}", file=sys.stderr)
        with codec:
            if not getattr(args, "quiet", False):
                print(f"s2.cpp harness: ggml {info.get('ggml_commit')} ({s2cpp.isa_key(info)}, llamafile "
                      f"{'on' if info.get('llamafile') else 'off'}); this library: {codec.backend_name}, "
                      f"{codec.n_threads} thread(s)", file=text)
            reports = {}
            for kind, data in _s2cpp_inputs(args, codec).items():
                report = s2cpp.compare_with_s2cpp(codec, kind, data, exe=exe, model=args.model,
                                                  threads=codec.n_threads)
                reports[kind] = report
                if not getattr(args, "quiet", False) and not _json_stdout(args):
                    print(f"\n== {kind}\n{report.table()}")
    except (CodecError, OSError, ValueError) as exc:
        return _error(str(exc) or type(exc).__name__, 1)

    def as_json() -> str:
        return json.dumps({k: json.loads(r.to_json()) for k, r in reports.items()}, indent=2)

    if _json_stdout(args):
        _say(args, as_json())
    if not _write_json(json_file, as_json):
        return 1
    meta = {"s2.cpp ggml": info.get("ggml_commit"), "ISA": s2cpp.isa_key(info), "model": args.model}
    if not _write_report(args, lambda page: page.s2cpp_page(reports, meta)):
        return 1
    return 0 if all(r.ok for r in reports.values()) else 1
