"""The diagnostics commands: ``compare`` (two dumps, code files or audio files, stage by stage)
and ``bench-backends`` (the same decode and encode on every backend of this build)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..errors import CodecError
from ..io.fileio import atomic_path
from ..tools.compare import CompareUsageError, compare

PROG = "pyggml-codec"


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


def register_cli(subparsers) -> None:
    """Add ``compare`` and ``bench-backends`` to an argparse ``_SubParsersAction``."""
    cmp_ = subparsers.add_parser(
        "compare", help="compare two dumps, code files or audio files stage by stage",
        description="Compare B against the reference A. Exit 0 within tolerance, 1 past it "
                    "(or an unreadable file), 2 for a usage error (e.g. files of different kinds).")
    cmp_.add_argument("a", type=Path, metavar="A", help="reference: dump .npz, code file, or audio file")
    cmp_.add_argument("b", type=Path, metavar="B", help="the same kind of file as A")
    cmp_.add_argument("--rel-rms", type=_non_negative, default=None, help="float-stage tolerance (default 1e-3)")
    cmp_.add_argument("--max-abs", type=_non_negative, default=None, help="also limit max |A-B| (default: unchecked)")
    cmp_.add_argument("--agreement", type=_non_negative, default=None,
                      help="least fraction of equal codes per codebook (default 1.0)")
    cmp_.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the report as JSON")
    cmp_.add_argument("-q", "--quiet", action="store_true", help="print only the verdict line")
    cmp_.set_defaults(func=cmd_compare)

    bench = subparsers.add_parser(
        "bench-backends", help="time decode and encode on every available backend",
        description="Run the same decode and encode on each backend of this ggml build: cold call "
                    "(graph build + first compute), warm median, compute memory, lowerings, and "
                    "deltas against the CPU result.")
    bench.add_argument("-m", "--model", type=Path, required=True, help="codec GGUF")
    bench.add_argument("--seconds", type=_positive, default=2.0, help="test signal length (default 2)")
    bench.add_argument("--repeats", type=int, default=3, help="warm runs per measurement (median; default 3)")
    bench.add_argument("--precision", choices=("f32", "s2cpp"), default="f32", help="codec precision (default f32)")
    bench.add_argument("--threads", type=int, default=None, help="CPU threads (default: usable cores)")
    bench.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the results as JSON")
    bench.set_defaults(func=cmd_bench_backends)


def _error(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def _tolerances_from(args: argparse.Namespace) -> dict[str, float]:
    names = {"rel_rms": args.rel_rms, "max_abs": args.max_abs, "agreement": args.agreement}
    return {k: v for k, v in names.items() if v is not None}


def cmd_compare(args: argparse.Namespace) -> int:
    """``compare A B``: print the table; 0 within tolerance, 1 past it or unreadable, 2 usage."""
    for p in (args.a, args.b):
        if not Path(p).is_file():
            return _error(f"{p}: no such file", 1)
    try:
        report = compare(args.a, args.b, _tolerances_from(args))
    except CompareUsageError as exc:
        return _error(str(exc), 2)
    except (CodecError, OSError, ValueError) as exc:
        return _error(str(exc) or type(exc).__name__, 1)
    print(report.verdict() if getattr(args, "quiet", False) else report.table())
    if not _write_json(args.json, report.to_json):
        return 1
    return 0 if report.ok else 1


def cmd_bench_backends(args: argparse.Namespace) -> int:
    """``bench-backends -m MODEL``: print the table (and write JSON); 0 when every backend ran."""
    from ..tools.bench import bench_backends

    if not Path(args.model).is_file():
        return _error(f"{args.model}: no such model file", 1)
    if args.repeats < 1:
        return _error(f"--repeats must be >= 1, got {args.repeats}", 2)
    try:
        result = bench_backends(args.model, seconds=args.seconds, repeats=args.repeats,
                                precision=args.precision, n_threads=args.threads)
    except (CodecError, OSError, ValueError) as exc:
        return _error(str(exc) or type(exc).__name__, 1)
    print(result.table())
    if not _write_json(args.json, result.to_json):
        return 1
    return 0 if result.ok else 1


def _write_json(path: Path | None, to_json) -> bool:
    """Write ``to_json()`` to ``path`` (``--json``, if given); False (error printed) when it cannot."""
    if path is None:
        return True
    try:
        _write_text(path, to_json())
    except OSError as exc:
        _error(f"{path}: cannot write ({exc.strerror or exc})", 1)
        return False
    return True


def _write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n")
