"""The docs code blocks run when tests/docs is named on the command line (scripts/docs_check.sh).

They need the ``docs`` and ``plot`` extras (``compare --report``), which the default suite's
environment lacks, so a plain ``pytest`` run does not collect them; ``scripts/docs_check.sh``
installs the extras and runs them as their own CI step. Every run that collects them ends with a
line saying how many blocks ran, failed and were skipped.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def _named(config) -> bool:
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if Path(collection_path).resolve().parent == HERE and Path(collection_path).suffix == ".py":
        return None if _named(config) else True
    return None


def pytest_terminal_summary(terminalreporter):
    outcome = {}
    for key in ("passed", "failed", "skipped", "error"):
        for r in terminalreporter.stats.get(key, []):
            if "test_code_block[" in getattr(r, "nodeid", ""):
                outcome[r.nodeid] = r.outcome  # a skip is reported at setup, a pass or failure at call
    if not outcome:
        return
    counts = {k: sum(1 for v in outcome.values() if v == k) for k in ("passed", "failed", "skipped")}
    terminalreporter.write_line(
        f"docs code blocks: {len(outcome)} collected, {counts['passed']} passed, "
        f"{counts['failed']} failed, {counts['skipped']} skipped (the reasons: pytest -rs)")
