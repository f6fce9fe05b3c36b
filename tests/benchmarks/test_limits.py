"""benchmarks/limits.py: the floor and ratio arithmetic, the streaming targets, the machine-kind
key, the page writer (one kind's section replaced, the others kept) and the FLOP meter over a
codec's calls. Timings are never asserted: the functions that measure are run for their shape."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import limits  # noqa: E402


def test_floor_and_ratio():
    assert limits.floor_s(200e9, 100.0) == pytest.approx(2.0)
    assert limits.ratio_to_floor(3.0, 200e9, 100.0) == pytest.approx(1.5)
    assert limits.ratio_to_floor(2.0, 200e9, 100.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="SGEMM rate"):
        limits.floor_s(1e9, 0)


def test_streaming_targets():
    # 10 ms per frame one-shot, 400 MB of weights at 20 GB/s: 20 ms to read them
    assert limits.one_stream_target_s(0.010, 400_000_000, 20.0) == pytest.approx(1.05 * 0.030)
    assert limits.many_streams_target_s(0.010) == pytest.approx(0.0105)
    with pytest.raises(ValueError, match="bandwidth"):
        limits.one_stream_target_s(0.01, 1, 0.0)


def test_stream_targets_are_judged_on_paired_runs():
    """A stream run paired with the one-shot runs around it: the machine slowed between the
    medians' runs (the medians alone miss the target), the paired ratio meets it; the table
    prints both."""
    import bench_streams

    one = [0.100, 0.100, 0.140, 0.140]  # one-shot runs (one more than the stream's), 10 frames each
    many = [0.104, 0.143, 0.145]  # each within 4 % of the one-shot runs around it
    row = bench_streams._row("streams8-chunk1", 8, 10, many, one)
    assert row["vs_one_shot_bracketed"] == pytest.approx(1.04, abs=1e-3)
    bench_streams.add_targets([row], 400_000_000, 20.0)
    print(f"paired {row['ms_per_frame_paired']:.2f} ms, median {row['ms_per_frame']:.2f} ms, "
          f"target {row['target_ms']:.2f} ms")
    assert row["target_ms"] == pytest.approx(1.05 * 12.0)  # the one-shot median: 12 ms per frame
    assert row["ms_per_frame"] > row["target_ms"] and not row["meets_target_medians"]
    assert row["ms_per_frame_paired"] < row["target_ms"] and row["meets_target"]
    slow = bench_streams._row("streams8-chunk1", 8, 10, [x * 1.1 for x in many], one)
    bench_streams.add_targets([slow], 400_000_000, 20.0)
    assert not slow["meets_target"]  # 10 % over its neighbours: missed either way
    table = bench_streams.targets_table([dict(row, file="F16"), dict(slow, file="F16")])
    assert "| yes / no |" in table and "| no / no |" in table


@pytest.mark.parametrize("model,flags,key", [
    ("Intel(R) Xeon(R) Platinum 8480C", {"avx2", "avx512f", "avx512_bf16", "avx512_fp16"},
     "intel-xeon-platinum-8480c-avx512fp16"),
    ("AMD EPYC 9654 96-Core Processor", {"avx2", "avx512f", "avx512_bf16"}, "amd-epyc-9654-avx512bf16"),
    ("AMD EPYC", {"avx2", "avx512f"}, "amd-epyc-avx512"),
    ("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", {"avx2", "fma"}, "intel-core-i7-8700-avx2"),
    ("Apple M2", set(), "apple-m2-baseline"),
    ("", set(), "unknown-cpu-baseline"),
])
def test_machine_kind(model, flags, key):
    assert limits.machine_kind(model, flags) == key


def test_machine_line_says_loaded_only_when_others_took_the_cpus():
    m = {"model": "AMD EPYC", "cpus": 2, "flags": ["avx2"], "blas": "OpenBLAS", "ggml": "ggml x"}
    assert "loaded" in limits.machine_line(m, others=0.35)
    assert "35 %" in limits.machine_line(m, others=0.35)
    # a share of a few per cent (timer ticks, daemons) is not a loaded machine
    assert "loaded" not in limits.machine_line(m, others=0.02)
    assert "loaded" not in limits.machine_line(m, others=None)


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu avx2 fma f16c avx512f avx512_bf16

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC 9999
stepping\t: 0
flags\t\t: fpu
"""


def test_cpuinfo_names_the_cpu_generation_in_the_machine_line(tmp_path):
    """The first CPU's model name, flags and CPUID numbers; the machine line carries the numbers,
    which tell apart CPUs that a VM names alike ("AMD EPYC": Zen 4 is family 25, Zen 5 family 26)."""
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    cpu = limits._cpuinfo(str(path))
    assert cpu["model"] == "AMD EPYC" and {"avx2", "avx512_bf16"} <= cpu["flags"] and "fpu" in cpu["flags"]
    assert limits.cpuid_text(cpu["cpuid"]) == "family 25, model 17, stepping 1"
    m = {"model": cpu["model"], "cpuid": limits.cpuid_text(cpu["cpuid"]), "cpus": 2, "flags": ["avx2"],
         "blas": "OpenBLAS", "ggml": "ggml x"}
    assert limits.machine_line(m).startswith("AMD EPYC (family 25, model 17, stepping 1), 2 logical CPUs; ")
    assert limits.machine_line(dict(m, cpuid="")).startswith("AMD EPYC, 2 logical CPUs; ")
    assert limits._cpuinfo(str(tmp_path / "absent")) == {"model": "unknown CPU", "flags": set(), "cpuid": {}}
    assert limits.cpuid_text({"cpu family": "6"}) == "family 6"


def _stat(user, system, idle, steal):
    return f"cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3 4\n"


def test_others_watch_counts_busy_time_not_ours(tmp_path, monkeypatch):
    """Others' share = (busy CPU time over the window - this process's own) / (window x CPUs),
    steal counted as others'. The clock, /proc/stat and the process's own CPU time are faked."""
    hz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    clock, own = iter([100.0, 110.0]), iter([5.0, 15.0])
    monkeypatch.setattr(limits.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(limits, "_own_cpu_s", lambda: next(own))
    monkeypatch.setattr(limits.os, "cpu_count", lambda: 2)
    stat.write_text(_stat(0, 0, 0, 0))
    watch = limits.OthersWatch(str(stat)).start()
    # 10 s on 2 CPUs: 20 CPU-seconds; 10 of them ours, 4 others' user time, 2 steal, the rest idle
    stat.write_text(_stat(12 * hz, 2 * hz, 6 * hz, 2 * hz))
    share = watch.share()
    print(f"others' share: {share:.3f} (want 0.300)")
    assert share == pytest.approx(0.30, abs=1e-9)


def test_others_watch_without_proc_stat_says_nothing(tmp_path):
    assert limits.OthersWatch(str(tmp_path / "missing")).start().share() is None


def _section(kind: str, body: str) -> str:
    return limits.section(kind, f"Machine: {kind}", "bash scripts/bench.sh --quick", body, date="2026-01-01")


def test_page_writer_replaces_one_kind_and_keeps_the_others(tmp_path):
    page = tmp_path / "performance.md"
    intro = "# Performance\n\nProse that stays.\n"
    limits.write_page(page, "kind-a", _section("kind-a", "| a | 1 |"), intro)
    limits.write_page(page, "kind-b", _section("kind-b", "| b | 1 |"), intro)
    first = page.read_text()
    assert first.startswith(intro)
    assert first.index("| a | 1 |") < first.index("| b | 1 |")
    limits.write_page(page, "kind-a", _section("kind-a", "| a | 2 |"), intro)
    text = page.read_text()
    assert "| a | 1 |" not in text and "| a | 2 |" in text
    assert "| b | 1 |" in text and "Prose that stays." in text
    assert text.count("<!-- bench:kind kind-a -->") == 1 and text.count("<!-- bench:kind kind-b -->") == 1
    assert text.index("| a | 2 |") < text.index("| b | 1 |")  # replaced in place
    assert "bash scripts/bench.sh --quick" in text and "2026-01-01" in text


def test_page_writer_keeps_prose_after_the_tables(tmp_path):
    page = tmp_path / "performance.md"
    page.write_text(f"# Performance\n\n{limits.TABLES_MARK}\n\n## Notes\n\nAfter the tables.\n")
    limits.write_page(page, "kind-a", _section("kind-a", "| a |"), "")
    text = page.read_text()
    assert text.index(limits.TABLES_MARK) < text.index("| a |") < text.index("## Notes")
    assert text.rstrip().endswith("After the tables.")


def test_bandwidth_buffer_is_twice_the_last_level_cache_past_512_mib(tmp_path):
    for i, size in enumerate(["48K", "2048K", "504M", "bad"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    (tmp_path / "index9").mkdir()  # no size file
    assert limits.last_level_cache_bytes(str(tmp_path)) == 504 << 20
    assert limits.last_level_cache_bytes(str(tmp_path / "missing")) is None
    assert limits.bandwidth_mib(504 << 20) == 1008
    assert limits.bandwidth_mib(105 << 20) == 512  # a cache well inside 512 MiB
    llc = limits.last_level_cache_bytes()  # this machine's, or None
    assert limits.bandwidth_mib() == (max(512, -(-2 * llc // (1 << 20))) if llc else 512)


def test_measurements_return_rates():
    rates = limits.sgemm_gflops(1, [(64, 64, 64)], reps=1, min_s=0.0)
    assert set(rates) == {(64, 64, 64)} and rates[(64, 64, 64)] > 0
    assert limits.bandwidth_gbs(2, mib=8, reps=1) > 0


def test_flop_meter_counts_every_graph_run(tmp_path, monkeypatch):
    import numpy as np

    import pyggml_codec
    from pyggml_codec.backend import flops, ggml_graph as graph
    from pyggml_codec.demo import build_demo_model

    ran = []
    original = graph.Graph.run

    def record(g, *args, **kwargs):
        ran.append(g)
        return original(g, *args, **kwargs)

    monkeypatch.setattr(graph.Graph, "run", record)
    with pyggml_codec.load(build_demo_model(tmp_path), n_threads=1) as codec:
        t = np.arange(codec.sample_rate) / codec.sample_rate
        codes = codec.encode((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))
        ran.clear()
        with limits.FlopMeter() as once:
            codec.decode(codes)
        assert graph.Graph.run is record  # restored
        ran_once = list(ran)
        by_hand = flops.FlopCount()
        for g in ran_once:
            by_hand += flops.count_graph(g.gf)
        with limits.FlopMeter() as twice:
            codec.decode(codes)
            codec.decode(codes)
    one = once.total()
    assert len(once.runs) == len(ran_once) >= 1
    assert one.products > 0 and one.uncounted == {}
    assert one.total == by_hand.total and one.by_op == by_hand.by_op
    assert twice.total().total == 2 * one.total and len(twice.runs) == 2 * len(once.runs)
    assert once.weight_bytes() > 0


def test_rows_get_their_floor_at_their_thread_count():
    import bench_codec

    rows = [dict(task="decode", threads=2, seconds=1.4, dtype="f16", precision="f32", ours_s=3.0, oracle_s=6.0,
                 flops=200e9, flops_products=190e9, flops_transforms=8e9, flops_elementwise=2e9, s2cpp_s=9.0),
            dict(task="decode", threads=1, seconds=1.4, dtype="f16", precision="f32", ours_s=3.0, oracle_s=6.0,
                 flops=200e9, flops_products=200e9, flops_transforms=0, flops_elementwise=0),
            dict(task="decode-fused", threads=2, ours_s=1.0, oracle_s=6.0)]
    bench_codec.add_limits(rows, {2: {"sgemm_gflops": 100.0}})
    assert rows[0]["floor_s"] == pytest.approx(2.0)
    assert rows[0]["ours_vs_floor"] == pytest.approx(1.5) and rows[0]["oracle_vs_floor"] == pytest.approx(3.0)
    assert rows[0]["s2cpp_vs_ours"] == pytest.approx(3.0)
    assert "floor_s" not in rows[1] and "floor_s" not in rows[2]  # no limits at 1 thread; no count
    table = bench_codec.limits_table(rows)
    assert "| 200.0 (190.0 / 8.0 / 2.0) | 100 | 2.000 | 3.000 | 1.50x | 6.000 | 3.00x | 9.000 | 3.00x |" in table
    assert table.count("\n") == 2  # header, rule, one row
    rows[0]["flops_uncounted"] = {"CUSTOM:new_kernel": 3}  # an op without a rule: the floor says so
    assert "(190.0 / 8.0 / 2.0, not counted: CUSTOM:new_kernel x3) |" in bench_codec.limits_table(rows)


def test_each_run_is_divided_by_the_sgemm_rate_measured_around_it():
    """A row with its runs' SGEMM brackets takes them, not the run's later rate: each run's time over
    the floor at the mean of the rates just before and after it, the median of those ratios."""
    import bench_codec

    # 200 GFLOP; ours 3 s at 80, 2 s at 100 (the machine sped up), 3.3 s at 60: 1.2x, 1.0x, 0.99x
    row = dict(task="decode", threads=2, seconds=1.4, dtype="f16", precision="f32", ours_s=3.0, oracle_s=6.0,
               flops=200e9, flops_products=200e9, flops_transforms=0, flops_elementwise=0,
               runs_ours=[(3.0, 78.0, 82.0), (2.0, 100.0, 100.0), (3.3, 60.0, 60.0)],
               runs_oracle=[(6.0, 82.0, 78.0), (4.0, 100.0, 100.0), (6.6, 60.0, 60.0)])
    other = dict(row, threads=1)
    del other["runs_ours"]  # no limits at 1 thread and no rates of its own: no floor
    bench_codec.add_limits([row, other], {2: {"sgemm_gflops": 100.0}})
    assert row["ours_vs_floor"] == pytest.approx(1.0) and row["oracle_vs_floor"] == pytest.approx(2.0)
    assert row["sgemm_gflops"] == 80.0 and row["floor_s"] == pytest.approx(2.5)  # the median rate
    assert "floor_unsteady" not in row and "floor_s" not in other
    # one rate for the whole row would have read the drift as speed: 3.0 s / (200 / 100) = 1.5x
    assert "| 80 | 2.500 | 3.000 | 1.00x | 6.000 | 2.00x |" in bench_codec.limits_table([row])


def test_runs_whose_sgemm_moved_around_them_do_not_count():
    """A run's ratio stands only where the SGEMM samples before and after it agree within
    SGEMM_SWING; a row with no such run of an engine has both ratios marked, and a note under the
    table gives the swing of its steadiest run."""
    import bench_codec

    base = dict(task="decode", threads=2, seconds=1.4, dtype="f16", precision="f32", ours_s=3.0, oracle_s=6.0,
                flops=200e9, flops_products=200e9, flops_transforms=0, flops_elementwise=0)
    # the second run's samples moved 1.41x: it does not count, the others give 1.5x and 3.0x
    steady = dict(base, runs_ours=[(3.0, 105.0, 95.0), (1.0, 282.7, 199.9), (3.0, 100.0, 100.0)],
                  runs_oracle=[(6.0, 95.0, 105.0), (6.0, 100.0, 100.0)])
    moved = dict(base, task="encode", runs_ours=[(3.0, 282.7, 199.9), (3.0, 150.0, 100.0)],
                 runs_oracle=[(6.0, 100.0, 100.0)])
    bench_codec.add_limits([steady, moved], {})
    assert "floor_unsteady" not in steady and moved["floor_unsteady"] == pytest.approx(282.7 / 199.9)
    assert steady["ours_vs_floor"] == pytest.approx(1.5) and steady["oracle_vs_floor"] == pytest.approx(3.0)
    table = bench_codec.limits_table([steady, moved])
    print(table)
    assert "| 2.000 | 3.000 | 1.50x | 6.000 | 3.00x |" in table  # the steady row, unmarked
    assert table.count("(unsteady)") == 2
    assert "in 1 of these rows" in table and "by 41 % around its steadiest run" in table
    assert "Unsteady" not in bench_codec.limits_table([steady])


def test_alternate_bracketed_samples_the_rate_between_every_two_runs(monkeypatch):
    """Ours and theirs alternate; a rate sample sits between every two timed runs, each run's
    bracket the samples on either side of it."""
    import bench_codec

    rates, calls = iter([10.0, 11.0, 12.0, 13.0, 14.0]), []
    monkeypatch.setattr(bench_codec, "paired_sgemm_gflops", lambda threads: next(rates))
    monkeypatch.setattr(bench_codec, "SETTLE_S", 0.0)
    ours, theirs = bench_codec.alternate_bracketed(lambda: calls.append("a"), lambda: calls.append("b"), 2, 2)
    assert calls == ["a", "b"] * 3  # a warm-up of each, then 2 reps
    assert [r[1:] for r in ours] == [(10.0, 11.0), (12.0, 13.0)]
    assert [r[1:] for r in theirs] == [(11.0, 12.0), (13.0, 14.0)]
    assert all(r[0] >= 0 for r in ours + theirs)


def test_one_stream_target_takes_the_bandwidth_measured_around_each_run():
    """Each one-stream run is judged against its own target, from the one-shot runs and the read
    rates sampled just before and after it: a run timed while memory read at 10 GB/s is not held
    to a target computed from a 40 GB/s sample taken another minute."""
    import bench_streams

    one = [0.100, 0.100, 0.100]  # 10 ms per frame one-shot, 10 frames
    # run 1 (50 ms per frame) read at 10 GB/s: target 1.05 x (10 + 40) = 52.5; run 2 (25 ms) at 40 GB/s: 21
    row = bench_streams._row("stream-chunk1", 1, 10, [0.5, 0.25], one, bandwidth_gbs_runs=[(8.0, 12.0), (40.0, 40.0)])
    bench_streams.add_targets([row], 400_000_000, 40.0)
    ratios = [50.0 / 52.5, 25.0 / 21.0]
    print(f"per-run ratios {ratios}, paired {row['ms_per_frame_paired']:.2f} against {row['target_ms']:.2f} ms")
    assert row["target_ms"] == pytest.approx((52.5 + 21.0) / 2)  # the median of the runs' targets
    assert row["bandwidth_gbs"] == pytest.approx(25.0)
    assert row["ms_per_frame_paired"] == pytest.approx(sum(ratios) / 2 * row["target_ms"])
    assert not row["meets_target"]  # the median of 0.952 and 1.190
    fast = bench_streams._row("stream-chunk1", 1, 10, [0.5, 0.5], one, bandwidth_gbs_runs=[(10.0, 10.0)] * 2)
    bench_streams.add_targets([fast], 400_000_000, 40.0)
    assert fast["meets_target"] and fast["target_ms"] == pytest.approx(52.5)
    plain = bench_streams._row("stream-chunk1", 1, 10, [0.2, 0.2], one)  # no samples: the run-level rate
    bench_streams.add_targets([plain], 400_000_000, 40.0)
    assert plain["target_ms"] == pytest.approx(1.05 * (10.0 + 10.0)) and plain["bandwidth_gbs"] == 40.0


def test_stream_runs_take_bandwidth_samples_around_each_run(monkeypatch):
    """The named function's runs are sampled just before and just after each, the others not."""
    import bench_streams

    monkeypatch.setattr(bench_streams, "SETTLE_S", 0.0)
    calls, values = [], iter(range(10))

    def sample():
        calls.append("bw")
        return next(values)

    fns = {"ref": lambda: calls.append("ref"), "a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times, samples = bench_streams._times(fns, 2, warm=False, around={"a": sample})
    assert calls == ["ref", "bw", "a", "bw", "b", "ref", "bw", "a", "bw", "b", "ref"]
    assert samples == {"a": [(0, 1), (2, 3)]}
    assert len(times["ref"]) == 3 and len(times["a"]) == 2


def test_one_stream_rows_carry_their_runs_bandwidth(tiny_model, monkeypatch):
    """bench_streams samples the read rate around each one-stream chunk-1 run, and that row's
    target comes from those samples, not from the run-level rate it is given."""
    import bench_streams
    import pyggml_codec

    monkeypatch.setattr(bench_streams, "SETTLE_S", 0.0)
    samples = iter([30.0, 50.0, 31.0, 33.0])
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1, parts="decode") as c:
        monkeypatch.setattr(bench_streams, "_first_frame_latency", lambda codec, items, reps: [0.01])
        rows = bench_streams.bench_streams(c, 2, 2, frames_one=2, bandwidth_gbs=99.0,
                                           measure_bandwidth=lambda: next(samples))
    row = next(r for r in rows if r["task"] == "stream-chunk1")
    assert row["bandwidth_gbs_runs"] == [(30.0, 50.0), (31.0, 33.0)]
    assert row["bandwidth_gbs"] == pytest.approx(36.0)  # the median of the runs' means, 40 and 32
    assert "bandwidth_gbs_runs" not in next(r for r in rows if r["task"] == "stream-chunk4")
    assert not any("round_trip_ns_runs" in r for r in rows)  # not asked for


def test_chunk1_rows_carry_each_runs_round_trip(tiny_model, monkeypatch):
    """With a round-trip sampler, both chunk-1 rows carry a (before, after) pair per run, the
    one-stream row beside its bandwidth pairs, and the targets table prints each run's pair."""
    import bench_streams
    import pyggml_codec

    monkeypatch.setattr(bench_streams, "SETTLE_S", 0.0)
    trips = iter([100.0, 120.0, 400.0, None, 380.0, 420.0, 110.0, 130.0])
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1, parts="decode") as c:
        monkeypatch.setattr(bench_streams, "_first_frame_latency", lambda codec, items, reps: [0.01])
        rows = bench_streams.bench_streams(c, 2, 2, frames_one=2, bandwidth_gbs=99.0,
                                           measure_bandwidth=lambda: 40.0, measure_round_trip=lambda: next(trips))
    one = next(r for r in rows if r["task"] == "stream-chunk1")
    many = next(r for r in rows if r["task"] == "streams8-chunk1")
    assert one["round_trip_ns_runs"] == [(100.0, 120.0), (400.0, None)]
    assert one["bandwidth_gbs_runs"] == [(40.0, 40.0)] * 2
    assert many["round_trip_ns_runs"] == [(380.0, 420.0), (110.0, 130.0)]
    assert "round_trip_ns_runs" not in next(r for r in rows if r["task"] == "streams8-chunk4")
    table = bench_streams.targets_table(rows)
    print(table)
    assert "cores' round trip ns, before / after each run |" in table
    assert "| 100 / 120, 400 / n/a |" in table and "| 380 / 420, 110 / 130 |" in table


def test_core_round_trip_is_measured_or_says_why_not(monkeypatch):
    """Between two CPUs a round trip takes some ns (above 10: a store seen by another core); with
    one CPU there is nothing to measure."""
    import os

    ns = limits.core_round_trip_ns(2000)
    print(f"round trip between the first two CPUs: {ns} ns")
    if len(os.sched_getaffinity(0)) >= 2:
        assert ns is not None and 10 < ns < 100_000
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert limits.core_round_trip_ns(2000) is None


def test_page_command_names_the_s2cpp_tree_not_its_path():
    import bench_codec

    tree = Path("/somewhere/s2.cpp")
    line = "bash scripts/bench.sh --seconds 1.4 --s2cpp /somewhere/s2.cpp --streams 16"
    assert bench_codec.page_command(line, tree) == "bash scripts/bench.sh --seconds 1.4 --s2cpp S2CPP_TREE --streams 16"
    assert bench_codec.page_command(line.replace("s2.cpp --", "s2.cpp/ --"), tree).count("S2CPP_TREE") == 1
    assert bench_codec.page_command(line, None) == line


def test_isa_level_reads_linux_flag_names():
    # /proc/cpuinfo spells AVX512-FP16 "avx512_fp16"
    assert limits.isa_level({"avx2", "avx512f", "avx512_bf16", "avx512_fp16"}) == "avx512fp16"
    assert "avx512_fp16" in limits.ISA_FLAGS
