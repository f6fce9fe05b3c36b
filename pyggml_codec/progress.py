"""Progress of long calls: the library never prints, a caller passes a callback.

Every long call (encode, decode, fetch, quantize, convert, corpus runs) takes an optional
``progress`` argument, a callable that receives :class:`Progress` reports. The CLI renders them
as progress bars (``cli/progress.py``); an application may log them or drive its own widget.

    >>> seen = []
    >>> report(seen.append, "decode", 16, 64, "frames")
    >>> seen[0].fraction
    0.25
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Progress:
    """One report of a long call's progress.

    ``task`` names the work ("encode", "decode", "fetch", "quantize", "convert", "corpus");
    ``done`` and ``total`` count in ``unit`` ("frames", "bytes", "files", "tensors", "s");
    ``total`` is None when it is not known; ``detail`` is a short free text (a file name).
    """

    task: str
    done: float
    total: Optional[float]
    unit: str
    detail: str = ""

    @property
    def fraction(self) -> Optional[float]:
        """``done / total``, or None when the total is unknown or zero."""
        return None if not self.total else self.done / self.total


ProgressCallback = Callable[[Progress], None]
"""What a ``progress=`` argument takes: a callable that receives each :class:`Progress` (what it
returns is ignored)."""


def report(callback: Optional[ProgressCallback], task: str, done: float, total: Optional[float], unit: str,
           detail: str = "") -> None:
    """Send one :class:`Progress` to ``callback`` (nothing when it is None)."""
    if callback is not None:
        callback(Progress(task, done, total, unit, detail))
