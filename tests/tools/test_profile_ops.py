"""tools/profile_ops.py on the demo model: every node timed and counted, the per-op rows adding up to
the call, and the floor columns consistent with the SGEMM rate the tool measured. No time is held to a
bound: the checks are on how the rows relate to each other (sums within the printed rounding)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from pyggml_codec.demo import build_demo_model

TOOL = Path(__file__).resolve().parents[2] / "tools" / "profile_ops.py"
ROW = re.compile(r"^  (\S+)\s+([\d.]+) ms\s+([\d.]+) %\s+(\d+) GFLOP/s(?:\s+excess\s+(-?[\d.]+) ms \(\s*(-?[\d.]+) % of all\))?$")


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("profile_ops", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo"), seed=0)


def _by_op(text: str) -> tuple[dict[str, tuple], float]:
    lines = text.splitlines()
    total = float(re.search(r"([\d.]+) ms (?:summed over nodes|medians of \d+ whole computes)", lines[0]).group(1))
    start = lines.index("by op:") + 1
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        m = ROW.match(line)
        assert m, f"unparsed row {line!r}"
        rows[m.group(1)] = tuple(float(g) if g is not None else None for g in m.groups()[1:])
    return rows, total


@pytest.mark.parametrize("what", ["decode", "encode", "stream"])
def test_rows_add_up_without_the_floor(tool, demo, capsys, what):
    assert tool.main(["-m", str(demo), "--what", what, "--seconds", "3", "--no-floor", "--top", "3"]) == 0
    out = capsys.readouterr().out
    rows, total = _by_op(out)
    ms = sum(r[0] for r in rows.values())
    print(f"{what}: {len(rows)} ops, rows {ms:.1f} ms against {total:.1f} ms")
    assert abs(ms - total) <= 0.05 * (len(rows) + 1) + 1e-9  # each row and the total rounded to 0.1 ms
    assert abs(sum(r[1] for r in rows.values()) - 100) <= 0.05 * len(rows) + 1e-9
    assert any(op.startswith("CUSTOM:") and r[2] > 0 for op, r in rows.items()), "no product with a rate"
    assert all(r[3] is None for r in rows.values()), "excess columns without a floor"
    assert "SGEMM" not in out


def test_excess_shares_follow_the_measured_floor(tool, demo, capsys):
    assert tool.main(["-m", str(demo), "--seconds", "3", "--top", "3"]) == 0
    out = capsys.readouterr().out
    rows, total = _by_op(out)
    head = re.search(r"SGEMM (\d+) GFLOP/s: floor ([\d.]+) ms, ([\d.]+)x the floor", out)
    assert head, out.splitlines()[:2]
    print(head.group(0))
    sgemm, floor_ms = float(head.group(1)), float(head.group(2))
    gflop = float(re.search(r"([\d.]+) GFLOP$", out.splitlines()[0]).group(1))
    # the floor is the call's operations at the printed SGEMM rate (rounded to 1 GFLOP/s, 0.01 GFLOP, 0.1 ms)
    want = gflop / sgemm * 1000
    assert abs(floor_ms - want) <= 0.05 + want * (0.5 / sgemm) + 0.005 / sgemm * 1000, (floor_ms, want)
    shares = [r[4] for r in rows.values()]
    assert all(s is not None for s in shares)
    assert abs(sum(shares) - 100) <= 0.05 * len(rows) + 1e-9, sum(shares)
    # each row's excess is its time less its operations at that rate: ms (1 - rate / SGEMM), the rate
    # printed to 1 GFLOP/s and the times to 0.1 ms
    for op, (ms, _, rate, excess, _) in rows.items():
        want = ms * (1 - rate / sgemm)
        assert abs(excess - want) <= 0.1 + ms * 0.5 / sgemm * (1 + rate / sgemm), (op, excess, want)


@pytest.mark.parametrize("what", ["decode", "stream"])
def test_timeline_rows_add_up(tool, demo, capsys, what):
    """--timeline: the kernels' nodes timed inside whole computes, ggml's own ops and the barriers
    in one (between) row, the rows adding up to the computes' medians' sum."""
    assert tool.main(["-m", str(demo), "--what", what, "--seconds", "3", "--no-floor", "--timeline", "2",
                      "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "ms medians of 2 whole computes" in out.splitlines()[0]
    rows, total = _by_op(out)
    ms = sum(r[0] for r in rows.values())
    between = re.search(r"^\(between\): ggml's own ops and the barriers between ops, ([\d.]+) ms; the first "
                        r"thread out of a timed op waiting for the last: ([\d.]+) ms in all$", out, re.M)
    print(f"{len(rows)} ops, rows {ms:.1f} ms against {total:.1f} ms; {between.group(0)}")
    assert abs(ms - total) <= 0.05 * (len(rows) + 1) + 1e-9
    assert rows["(between)"][0] == float(between.group(1)) > 0
    assert any(op.startswith("CUSTOM:") and r[2] > 0 for op, r in rows.items()), "no product with a rate"
    assert not any(op in rows for op in ("MUL_MAT", "ADD", "RESHAPE")), "ggml's own ops have no rows of their own"


@pytest.mark.parametrize("runs", ["0", "-1"])
def test_timeline_needs_a_run(tool, demo, capsys, runs):
    with pytest.raises(SystemExit):
        tool.main(["-m", str(demo), "--timeline", runs])
    assert f"--timeline takes a count of runs of at least 1, not {runs}" in capsys.readouterr().err
