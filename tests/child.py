"""Run code that might abort the interpreter in a fresh Python, and name the case that died.

A GGML_ASSERT calls ``abort()``, which no ``try`` can catch, so every probe that could reach
one runs here. The child prints ``CASE <id>`` before and ``DONE <id> <json>`` after each case;
if it dies, the last case without a ``DONE`` is the one that killed it.

Time is never a verdict here: ``hang_s`` only ends a child that stopped making progress, and
sits far above any normal run (the slowest child here, the graph-builder sweep, takes about
30 s on 2 loaded cores; HANG_S is 40x that). Reaching it fails the test as a hang.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HANG_S = 1200.0
REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"

# Prepended to every child script: a case reporter the child calls as ``case(id, fn)``.
PRELUDE = '''
import json, sys, traceback
def case(case_id, fn):
    print("CASE", case_id, flush=True)
    try:
        result = fn()
    except BaseException as exc:
        result = {"raised": type(exc).__name__, "message": str(exc)}
    print("DONE", case_id, json.dumps(result, default=str), flush=True)
    return result
'''


@dataclass
class ChildRun:
    returncode: int
    stdout: str
    stderr: str
    results: dict[str, object] = field(default_factory=dict)
    last_started: str | None = None

    def died_in(self) -> str | None:
        """The case that was running when the child died, if it died."""
        return self.last_started if self.last_started not in self.results else None

    def why(self) -> str:
        rc = self.returncode
        sig = f" (signal {signal.Signals(-rc).name})" if rc < 0 else ""
        return f"child exited with {rc}{sig}; stderr tail:\n{self.stderr[-2000:]}"


def run(script: str, *args: str, hang_s: float = HANG_S) -> ChildRun:
    """Run ``PRELUDE + script`` with ``args`` as sys.argv[1:]; never raises on a crash (a child
    still running after ``hang_s`` fails the test as hung)."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, "-c", PRELUDE + script, *args], capture_output=True, text=True, check=False,
                              timeout=hang_s, env=env, cwd=REPO)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        run_ = _parse(ChildRun(-signal.SIGKILL, out, f"hung: still running after {hang_s} s"))
        pytest.fail(f"the child hung in case {run_.died_in()!r}: still running after the {hang_s:.0f} s hang guard "
                    f"(a hang, not a speed verdict)")
    return _parse(ChildRun(proc.returncode, proc.stdout, proc.stderr))


def _parse(r: ChildRun) -> ChildRun:
    for line in r.stdout.splitlines():
        if line.startswith("CASE "):
            r.last_started = line[5:].strip()
        elif line.startswith("DONE "):
            case_id, _, payload = line[5:].partition(" ")
            r.results[case_id] = json.loads(payload)
    return r


def run_cases(script: str, *args: str, hang_s: float = HANG_S) -> dict[str, object]:
    """Run a case-reporting child; fail the test naming the case if the child died or hung."""
    r = run(script, *args, hang_s=hang_s)
    if r.returncode != 0:
        pytest.fail(f"case {r.died_in()!r} killed the child: {r.why()}")
    return r.results
