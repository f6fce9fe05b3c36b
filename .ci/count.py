#!/usr/bin/env python3
"""Print a CI step's test counts from pytest's JUnit XML and hold them to the step's floor.

    python3 .ci/count.py STEP JUNIT.xml

STEP names a line of .ci/floors ("STEP MIN_PASSED"). Prints the passed, skipped, failed and
errored counts and every skip reason with its count; exits 1 when a test failed or errored,
when fewer than MIN_PASSED tests passed, when the step has no floor, or when the XML is
missing or unreadable (a step that ran nothing has no floor to meet).
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

FLOORS = Path(__file__).resolve().parent / "floors"


def floors(path: Path = FLOORS) -> dict[str, int]:
    out: dict[str, int] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or parts[0] in out:
            raise SystemExit(f"{path}:{n}: expected 'STEP MIN_PASSED' once per step, got {line!r}")
        out[parts[0]] = int(parts[1])
    return out


def counts(xml: Path) -> tuple[collections.Counter, collections.Counter]:
    """(outcome counts, skip reason counts) of every testcase in the file."""
    root = ET.parse(xml).getroot()
    outcome: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if "error" in kinds:
            outcome["errors"] += 1
        elif "failure" in kinds:
            outcome["failed"] += 1
        elif "skipped" in kinds:
            outcome["skipped"] += 1
            skip = case.find("skipped")
            reasons[(skip.get("message") or "").strip() or "(no reason)"] += 1
        else:
            outcome["passed"] += 1
    return outcome, reasons


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    step, xml = argv[0], Path(argv[1])
    table = floors()
    if step not in table:
        print(f"ci count: step {step!r} has no floor in {FLOORS}", file=sys.stderr)
        return 1
    try:
        outcome, reasons = counts(xml)
    except (OSError, ET.ParseError) as exc:
        print(f"ci count: {step}: no readable JUnit XML at {xml}: {exc}", file=sys.stderr)
        return 1
    floor = table[step]
    print(f"== {step}: {outcome['passed']} passed, {outcome['skipped']} skipped, {outcome['failed']} failed, "
          f"{outcome['errors']} errors (floor: {floor} passed)")
    for reason, n in reasons.most_common():
        print(f"   skipped {n:4d}: {reason}")
    bad = []
    if outcome["failed"] or outcome["errors"]:
        bad.append(f"{outcome['failed']} failed, {outcome['errors']} errors")
    if outcome["passed"] < floor:
        bad.append(f"{outcome['passed']} passed, below the floor of {floor} in {FLOORS.name}")
    if bad:
        print(f"ci count: {step} FAILS: {'; '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
