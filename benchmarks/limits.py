"""The machine's own limits, measured in the benchmark's run, and the page that shows them.

* :func:`sgemm_gflops`: numpy's (OpenBLAS) SGEMM rate at a thread count, best of N, on
  1024 x 1024 x 1024 and on the codec's own product shapes;
* :func:`bandwidth_gbs`: a streaming read of a buffer larger than the last-level cache
  (:func:`bandwidth_mib`: 512 MiB, or twice the cache where that is more), split over the
  threads, best of N;
* :func:`core_round_trip_ns`: a cache line passed back and forth between two threads pinned to the
  first two CPUs the process may use: tens of ns between cores that share a last-level cache,
  several hundred between dies (a VM can move its two cores from one placement to the other
  while it runs);
* :class:`FlopMeter`: the operations of every graph the codec computes while it is active
  (``pyggml_codec.backend.flops``: products, Winograd transforms, elementwise), and the bytes of
  weights those graphs read;
* the arithmetic: floor = FLOPs / SGEMM rate, ratio = time / floor; a stream's target per
  frame;
* :func:`machine_line`, :func:`machine_kind`: what ran, and the key of its table on the page;
* :func:`write_page`: ``docs/performance.md`` holds one table per machine kind; a run replaces
  its own kind's table and keeps the others.

No timing is asserted anywhere: the figures are reported.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REFERENCE_SHAPE = (1024, 1024, 1024)  # M, K, N
STREAM_SLACK = 1.05  # the streaming targets' margin


# --------------------------------------------------------------------------- arithmetic


def floor_s(flops: float, gflops: float) -> float:
    """The time the work would take at the SGEMM rate: ``flops / (gflops * 1e9)`` seconds."""
    if gflops <= 0:
        raise ValueError(f"SGEMM rate must be > 0 GFLOP/s, got {gflops}")
    return flops / (gflops * 1e9)


def ratio_to_floor(seconds: float, flops: float, gflops: float) -> float:
    """How many times its floor a run took (1.0: at the SGEMM rate)."""
    return seconds / floor_s(flops, gflops)


def one_stream_target_s(one_shot_per_frame_s: float, weight_bytes: int, bandwidth_gbs: float) -> float:
    """One stream at chunk 1, per frame: ``1.05 x (one-shot time per frame + weight bytes /
    bandwidth)``: a one-frame push must read every weight its graphs use once."""
    if bandwidth_gbs <= 0:
        raise ValueError(f"bandwidth must be > 0 GB/s, got {bandwidth_gbs}")
    return STREAM_SLACK * (one_shot_per_frame_s + weight_bytes / (bandwidth_gbs * 1e9))


def many_streams_target_s(one_shot_per_frame_s: float) -> float:
    """8 streams at chunk 1, per frame and stream: ``1.05 x`` the one-shot time per frame."""
    return STREAM_SLACK * one_shot_per_frame_s


# --------------------------------------------------------------------------- measurements


_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads")


def _openblas_setter():
    """numpy's OpenBLAS thread-count setter (through threadpoolctl where installed)."""
    try:
        import threadpoolctl

        return lambda n: threadpoolctl.threadpool_limits(n, user_api="blas")
    except ImportError:
        pass
    from pyggml_codec.backend import kernels

    if kernels.BLAS is None:
        return None
    dll = ctypes.CDLL(kernels.BLAS.path)
    for name in _SETTERS:
        fn = getattr(dll, name, None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int]
            return fn
    return None


@contextlib.contextmanager
def blas_threads(n: int):
    setter = _openblas_setter()
    if setter is None:
        yield False
        return
    held = setter(n)
    try:
        yield True
    finally:
        if hasattr(held, "restore_original_limits"):
            held.restore_original_limits()
        else:
            setter(os.cpu_count() or 1)


def sgemm_gflops(threads: int, shapes=(REFERENCE_SHAPE,), reps: int = 5, min_s: float = 0.2) -> dict:
    """GFLOP/s of numpy's float32 matmul (``M x K`` by ``K x N``) per shape, best of ``reps``
    timings of enough calls to last ``min_s``, at ``threads`` BLAS threads."""
    rng = np.random.default_rng(0)
    out = {}
    with blas_threads(threads):
        for m, k, n in shapes:
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            a @ b
            t0 = time.perf_counter()
            a @ b
            calls = max(1, int(min_s / max(time.perf_counter() - t0, 1e-6)))
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                for _ in range(calls):
                    a @ b
                best = min(best, (time.perf_counter() - t0) / calls)
            out[(m, k, n)] = 2 * m * k * n / best / 1e9
    return out


BANDWIDTH_MIB = 512  # the bandwidth read's least buffer


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The largest cache that Linux lists for CPU 0 (``index*/size``: "32K", "2048K", "504M"), in
    bytes; None where it lists none."""
    sizes = []
    for index in Path(root).glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", text)
        if m:
            sizes.append(int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)])
    return max(sizes) if sizes else None


def bandwidth_mib(llc_bytes: int | None = None) -> int:
    """The bandwidth read's buffer: BANDWIDTH_MIB, or twice the last-level cache where that is
    more. A buffer barely past the cache is not read from memory throughout: a cache that keeps
    part of a cyclic stream (as adaptive replacement does) serves that part."""
    llc = last_level_cache_bytes() if llc_bytes is None else llc_bytes
    return max(BANDWIDTH_MIB, -(-2 * llc // (1 << 20))) if llc else BANDWIDTH_MIB


def bandwidth_gbs(threads: int, mib: int = BANDWIDTH_MIB, reps: int = 5) -> float:
    """GB/s of a streaming read of a ``mib`` MiB buffer (larger than the last-level cache),
    ``threads`` numpy reductions over equal parts at once, best of ``reps``."""
    buf = np.ones((mib << 20) // 8, dtype=np.int64)
    parts = np.array_split(buf, threads)
    best = float("inf")
    for _ in range(reps + 1):  # the first touches the pages
        workers = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return buf.nbytes / best / 1e9


_ROUND_TRIP_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
static _Atomic long flag __attribute__((aligned(64)));
struct job { int cpu; long n; int pinned; };
static int pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s) == 0;
}
static void * answer(void * arg) {
    struct job * j = arg;
    j->pinned = pin(j->cpu);
    for (long i = 0; i < j->n; i++) {
        while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 1) {}
        atomic_store_explicit(&flag, 2 * i + 2, memory_order_release);
    }
    return 0;
}
/* ns per round trip between CPUs a and b, timed after as many untimed ones (both threads on their
   CPUs by then); -1 where a thread cannot be pinned */
double round_trip_ns(int a, int b, long n) {
    struct job ask = {a, 2 * n, 0}, other = {b, 2 * n, 0};
    pthread_t t;
    cpu_set_t old;
    pthread_getaffinity_np(pthread_self(), sizeof old, &old);
    atomic_store(&flag, 0);
    ask.pinned = pin(a);
    if (pthread_create(&t, 0, answer, &other) != 0) {
        pthread_setaffinity_np(pthread_self(), sizeof old, &old);
        return -1;
    }
    struct timespec t0, t1;
    for (long i = 0; i < 2 * n; i++) {
        if (i == n) clock_gettime(CLOCK_MONOTONIC, &t0);
        atomic_store_explicit(&flag, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 2) {}
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(t, 0);
    pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    if (!ask.pinned || !other.pinned) return -1;
    return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n;
}
"""
_round_trip = None


def core_round_trip_ns(n: int = 20000) -> float | None:
    """Mean ns of a round trip of one cache line between two threads pinned to the first two CPUs
    this process may run on, over ``n`` round trips after ``n`` untimed ones (compiled once per
    process with ``cc``); None where there are fewer than two CPUs, no compiler, or the threads
    cannot be pinned. On a 2-core VM these are the cores the codec's two threads run on: 49-68 ns
    on one die and 311-350 on two, on the VM this was written on, which moved between the two
    every few seconds to minutes."""
    global _round_trip
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    if _round_trip is None:
        import subprocess
        import tempfile

        try:
            with tempfile.TemporaryDirectory(prefix="round_trip_") as tmp:
                (Path(tmp) / "rt.c").write_text(_ROUND_TRIP_C)
                subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-pthread", "-o",
                                f"{tmp}/rt.so", f"{tmp}/rt.c"], check=True, capture_output=True)
                lib = ctypes.CDLL(f"{tmp}/rt.so")  # mapped: the files can go
        except (OSError, subprocess.CalledProcessError):
            _round_trip = False
            return None
        lib.round_trip_ns.restype, lib.round_trip_ns.argtypes = ctypes.c_double, [ctypes.c_int, ctypes.c_int,
                                                                                  ctypes.c_long]
        _round_trip = lib.round_trip_ns
    if _round_trip is False:
        return None
    ns = _round_trip(cpus[0], cpus[1], n)
    return ns if ns > 0 else None


@dataclass
class FlopMeter:
    """While active (``with meter:``), every ``Graph.run`` adds its graph's operations (counted
    once per graph, then multiplied by its runs) and the weight bytes it reads."""

    runs: list = field(default_factory=list)  # (count, weight bytes) per run, in order
    _cache: dict = field(default_factory=dict)

    def __enter__(self):
        from pyggml_codec.backend import flops, ggml_graph as graph

        self._original = graph.Graph.run
        meter, original = self, self._original

        def run(g, *args, **kwargs):
            key = id(g)
            if key not in meter._cache or meter._cache[key][0] is not g.gf:
                meter._cache[key] = (g.gf, flops.count_graph(g.gf), flops.weight_bytes(g.gf))
            _, count, wbytes = meter._cache[key]
            meter.runs.append((count, wbytes))
            return original(g, *args, **kwargs)

        graph.Graph.run = run
        return self

    def __exit__(self, *exc):
        from pyggml_codec.backend import ggml_graph as graph

        graph.Graph.run = self._original
        return False

    def reset(self) -> None:
        self.runs.clear()

    def total(self):
        from pyggml_codec.backend.flops import FlopCount

        out = FlopCount()
        for count, _ in self.runs:
            out += count
        return out

    def weight_bytes(self) -> int:
        """Weight bytes the runs read, each run's counted (one push: its latent and wave graphs)."""
        return sum(w for _, w in self.runs)


def measure_flops(fn) -> "object":
    """The :class:`FlopCount` of everything ``fn()`` computes."""
    with FlopMeter() as meter:
        fn()
    return meter.total()


# --------------------------------------------------------------------------- the machine


CPUID_FIELDS = ("cpu family", "model", "stepping")  # /proc/cpuinfo's numbers of a CPU generation


def _cpuinfo(path: str = "/proc/cpuinfo") -> dict:
    """The first CPU's model name, ISA flags and CPUID numbers (family, model, stepping: a VM's
    model name may say only "AMD EPYC", which they tell apart as Zen 4 or Zen 5)."""
    info: dict = {"model": "unknown CPU", "flags": set(), "cpuid": {}}
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and info["model"] == "unknown CPU":
                    info["model"] = value.strip()
                elif key == "flags" and not info["flags"]:
                    info["flags"] = set(value.split())
                elif key in CPUID_FIELDS and key not in info["cpuid"]:
                    info["cpuid"][key] = value.strip()
    except OSError:
        pass
    return info


def cpuid_text(cpuid: dict) -> str:
    """'family 25, model 17, stepping 1' from /proc/cpuinfo's fields ('' where it gave none)."""
    return ", ".join(f"{key.split()[-1]} {cpuid[key]}" for key in CPUID_FIELDS if cpuid.get(key))


ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "avx512_vp2intersect", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def isa_level(flags) -> str:
    """The widest of the ISA levels that decide these kernels' speed: avx512fp16, avx512bf16,
    avx512, avx2 or baseline."""
    flags = set(flags)
    if flags & {"avx512_fp16", "avx512fp16"}:  # Linux's /proc/cpuinfo says avx512_fp16
        return "avx512fp16"
    if "avx512f" in flags:
        return "avx512bf16" if "avx512_bf16" in flags else "avx512"
    return "avx2" if "avx2" in flags else "baseline"


def machine_kind(model: str, flags) -> str:
    """The page's key of a machine kind: the CPU model as a slug, then its ISA level
    ("amd-epyc-avx512bf16", "intel-xeon-platinum-8480c-avx512fp16")."""
    slug = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$|\bprocessor\b|\d+-core", " ", model.lower())
    slug = re.sub(r"[^a-z0-9]+", "-", slug).strip("-") or "unknown-cpu"
    return f"{slug}-{isa_level(flags)}"


def machine() -> dict:
    """CPU model, ISA flags, cores, the BLAS and its kernel, ggml's build flags."""
    from pyggml_codec.backend import binding, kernels

    cpu = _cpuinfo()
    blas = "none"
    if kernels.BLAS is not None:
        about = kernels.BLAS.describe()
        blas = f"{' '.join((about.get('config') or os.path.basename(about['path'])).split()[:2])} " \
               f"(kernel {about.get('corename')}, {about['threading']})"
    try:
        import threadpoolctl

        pools = [f"{p.get('internal_api')} {p.get('version')} {p.get('architecture')}"
                 for p in threadpoolctl.threadpool_info() if p.get("user_api") == "blas"]
        blas = "; ".join(pools) or blas
    except ImportError:
        pass
    features = binding.cpu_features()
    ggml = sorted(k for k, v in features.items() if v not in ("", "0"))
    return {"model": cpu["model"], "cpuid": cpuid_text(cpu["cpuid"]),
            "flags": sorted(f for f in ISA_FLAGS if f in cpu["flags"]),
            "kind": machine_kind(cpu["model"], cpu["flags"]), "cpus": os.cpu_count(),
            "blas": blas, "ggml": f"ggml {binding.ggml_version()}: {' '.join(ggml)}; llamafile "
                                  f"{'on' if binding.has_llamafile() else 'off'}"}


OTHERS_LOADED = 0.10  # the machine line says "loaded" past this share of the CPUs' time used by others


def _busy_cpu_s(stat: str) -> float:
    """Seconds of CPU time spent busy on all CPUs since boot, from /proc/stat's text: user, nice,
    system, irq, softirq and steal (a hypervisor's other guests); idle and iowait left out, and
    guest time too (already inside user)."""
    fields = [int(v) for v in stat.splitlines()[0].split()[1:]]
    busy = sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields))
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


class OthersWatch:
    """The share of the machine's CPU time that something other than this process and its
    waited-for children used between ``start()`` and ``share()``: other processes, and a VM's
    steal. The load average cannot say this: a benchmark's own threads raise it to the thread
    count. ``share()`` is None where /proc/stat is missing (not Linux)."""

    def __init__(self, stat_path: str = "/proc/stat"):
        self.stat_path = stat_path
        self._start: tuple[float, float, float] | None = None

    def _sample(self) -> tuple[float, float, float] | None:
        try:
            text = Path(self.stat_path).read_text()
        except OSError:
            return None
        return time.monotonic(), _busy_cpu_s(text), _own_cpu_s()

    def start(self) -> "OthersWatch":
        self._start = self._sample()
        return self

    def share(self) -> float | None:
        end = self._sample()
        if self._start is None or end is None or end[0] <= self._start[0]:
            return None
        elapsed, busy, own = (b - a for a, b in zip(self._start, end))
        return min(1.0, max(0.0, (busy - own) / (elapsed * (os.cpu_count() or 1))))


def machine_line(m: dict, others: float | None = None) -> str:
    """One line: what the figures ran on. ``others``: the share of the CPUs' time other
    processes (and a VM's steal) took while the figures were measured (``OthersWatch``); past
    OTHERS_LOADED the line says the machine was loaded."""
    cpu = f"{m['model']} ({m['cpuid']})" if m.get("cpuid") else m["model"]
    line = (f"{cpu}, {m['cpus']} logical CPUs; ISA {' '.join(m['flags']) or 'baseline'}; "
            f"BLAS {m['blas']}; {m['ggml']}")
    if others is not None and others > OTHERS_LOADED:
        line += (f"; measured while the machine was loaded (other processes and steal took "
                 f"{100 * others:.0f} % of its CPU time)")
    return line


# --------------------------------------------------------------------------- the page

BEGIN, END = "<!-- bench:kind {} -->", "<!-- /bench:kind {} -->"
TABLES_MARK = "<!-- bench:tables -->"


def section(kind: str, machine_text: str, command: str, body: str, date: str | None = None) -> str:
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{BEGIN.format(kind)}\n### `{kind}`\n\n{machine_text}\n\nMeasured {date} with:\n\n"
            f"```\n{command}\n```\n\n{body.strip()}\n{END.format(kind)}\n")


def replace_section(page: str, kind: str, new: str) -> str:
    """``page`` with the section of ``kind`` replaced by ``new`` (or added after the others,
    or after the tables mark, or at the end); other kinds' sections untouched."""
    pattern = re.compile(re.escape(BEGIN.format(kind)) + r".*?" + re.escape(END.format(kind)) + r"\n?", re.S)
    if pattern.search(page):
        return pattern.sub(lambda _: new, page, count=1)
    ends = list(re.finditer(re.escape("<!-- /bench:kind ") + r"[^ ]+ -->\n?", page))
    at = ends[-1].end() if ends else (page.index(TABLES_MARK) + len(TABLES_MARK) + 1 if TABLES_MARK in page
                                      else len(page))
    before, after = page[:at], page[at:]
    if before and not before.endswith("\n\n"):
        before = before.rstrip("\n") + "\n\n"
    return before + new + ("\n" + after.lstrip("\n") if after.strip() else "")


def write_page(path: Path, kind: str, new: str, intro: str) -> None:
    """Put ``new`` as the section of ``kind`` in the page at ``path`` (made from ``intro`` if absent)."""
    page = path.read_text() if path.exists() else intro
    if TABLES_MARK not in page and not path.exists():
        page = page.rstrip("\n") + f"\n\n{TABLES_MARK}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_section(page, kind, new))
