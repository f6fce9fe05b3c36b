"""Progress bars of the CLI: :class:`pyggml_codec.progress.Progress` reports rendered with tqdm.

The library never prints; its long calls take a ``progress`` callback. :class:`Bars` is that
callback for the command line: one tqdm bar per task on stderr, closed when its count reaches
its total (or when the bars are closed). ``--progress`` / ``--no-progress`` decide whether bars
are shown; without either they are shown when stderr is a terminal. ``-q`` silences them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from ..progress import Progress

BYTE_UNITS = ("bytes", "B")


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` (default: bars when stderr is a terminal)."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bars on stderr (default: on when stderr is a terminal; -q turns them off)")


def progress_enabled(args: argparse.Namespace, stream: TextIO | None = None) -> bool:
    """Whether ``args`` ask for bars: never with ``-q``; ``--progress`` / ``--no-progress``
    decide; otherwise when ``stream`` (stderr) is a terminal."""
    if getattr(args, "quiet", False):
        return False
    choice = getattr(args, "progress", None)
    if choice is not None:
        return bool(choice)
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Bars:
    """A progress callback drawing one tqdm bar per task; does nothing when not ``enabled``.

    Use as a context manager (or call :meth:`close`) so that bars left open end their line.
    A report whose unit or total differs from its task's open bar starts a new bar.
    """

    def __init__(self, enabled: bool, stream: TextIO | None = None):
        self.enabled = enabled
        self.stream = stream
        self._bars: dict[str, Any] = {}

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        bar = self._bars.get(p.task)
        if bar is not None and (bar.unit != _unit(p.unit) or bar.total != p.total):
            self._close(p.task)
            bar = None
        if bar is None:
            bar = self._bars[p.task] = self._open(p)
        bar.n = p.done if isinstance(p.done, int) or p.unit in BYTE_UNITS else round(p.done, 3)
        if p.detail:
            bar.set_postfix_str(p.detail[-40:], refresh=False)
        if p.total is not None and p.done >= p.total:
            self._close(p.task)
        else:
            bar.refresh()

    def _open(self, p: Progress):
        from tqdm import tqdm

        in_bytes = p.unit in BYTE_UNITS
        return tqdm(total=p.total, desc=p.task, unit=_unit(p.unit), unit_scale=in_bytes, unit_divisor=1024 if in_bytes else 1000,
                    file=self.stream if self.stream is not None else sys.stderr, position=len(self._bars),
                    leave=True, dynamic_ncols=True, mininterval=0.2)

    def _close(self, task: str) -> None:
        bar = self._bars.pop(task, None)
        if bar is not None:
            bar.refresh()
            bar.close()

    def note(self, text: str) -> None:
        """Print ``text`` on its own line, above any bars (stderr)."""
        stream = self.stream if self.stream is not None else sys.stderr
        if self.enabled and self._bars:
            from tqdm import tqdm

            tqdm.write(text, file=stream)
        else:
            print(text, file=stream)

    def close(self) -> None:
        for task in list(self._bars):
            self._close(task)

    def __enter__(self) -> "Bars":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unit(unit: str) -> str:
    return "B" if unit in BYTE_UNITS else unit


def bars_for(args: argparse.Namespace) -> Bars:
    """The :class:`Bars` the parsed ``args`` ask for."""
    return Bars(progress_enabled(args))
