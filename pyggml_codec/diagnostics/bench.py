"""The same decode and encode on every backend of this ggml build, timed and cross-checked.

Per backend and direction:

* ``cold_s``: the first call with no graph of that direction cached: graph build,
  allocation and one compute; ``build_s`` = cold minus the warm median (an estimate of the build cost);
* ``warm_s``: the median of ``repeats`` further calls (graphs cached);
* ``compute_bytes``: the compute buffers ggml's allocator reserved for the graphs that
  direction used (``Graph.compute_bytes`` of the codec's cached graphs), summed: the
  graphs of one call are all held at once;
* deltas against the CPU row: decode audio max abs and relative RMS (every backend
  decodes the CPU's codes), encode code agreement (min over codebooks).

On a CPU-only build the table has one row and :attr:`BenchResult.note` says so.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .compare import code_agreement, float_metrics, json_safe
from ..api import load
from ..backend.runtime import available_backends
from ..errors import CodecError

DECODE_GRAPHS = ("latent", "wave", "fused")  # Codec graph-cache key kinds (codec.py)
ENCODE_GRAPHS = ("enc", "enc2")


@dataclass
class Timing:
    cold_s: float
    warm_s: float
    compute_bytes: int
    graphs: dict[str, int]  # "kind:n" -> compute bytes

    @property
    def build_s(self) -> float:
        return max(0.0, self.cold_s - self.warm_s)


@dataclass
class BackendRow:
    backend: str
    device: str = ""
    error: str | None = None
    encode: Timing | None = None
    decode: Timing | None = None
    decode_path: str | None = None
    lowerings: dict[str, str] = field(default_factory=dict)
    products: str = ""  # codec.plan.products: how the backend computes F32 products
    decode_max_abs: float | None = None
    decode_rel_rms: float | None = None
    codes_agreement: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class BenchResult:
    model: str
    seconds: float
    precision: str
    repeats: int
    rows: list[BackendRow]
    note: str | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def row(self, backend: str) -> BackendRow:
        return next(r for r in self.rows if r.backend == backend)

    def table(self) -> str:
        head = ("backend", "device", "enc cold s", "enc warm s", "enc MB", "dec cold s", "dec warm s", "dec MB",
                "dec path", "dec max abs", "dec rel RMS", "codes agree")
        rows = [head] + [_cells(r) for r in self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [f"{self.model}: {self.seconds:g} s signal, precision {self.precision}; cold = first call with no "
                 f"graph cached (graph build + compute), warm = median of {self.repeats}; MB = compute buffers"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        for r in self.rows:
            if r.error:
                lines.append(f"{r.backend}: FAILED: {r.error}")
            elif r.lowerings:
                pairs = ", ".join(f"{k}={v}" for k, v in sorted(r.lowerings.items()))
                lines.append(f"{r.backend} lowerings: {pairs}; products: {r.products}")
        if self.note:
            lines.append(f"note: {self.note}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for r in self.rows:
            d = asdict(r)
            for key in ("encode", "decode"):
                t = getattr(r, key)
                if t is not None:
                    d[key]["build_s"] = t.build_s
            rows.append({**d, "ok": r.ok})
        return {"model": self.model, "seconds": self.seconds, "precision": self.precision, "repeats": self.repeats,
                "note": self.note, "ok": self.ok, "rows": rows}

    def to_json(self) -> str:
        return json.dumps(json_safe(self.to_dict()), indent=2, allow_nan=False)


def _cells(r: BackendRow) -> tuple[str, ...]:
    def t(x: Timing | None, attr: str) -> str:
        if x is None:
            return "-"
        return f"{getattr(x, attr) / 2**20:.1f}" if attr == "compute_bytes" else f"{getattr(x, attr):.4f}"

    def e(v: float | None, pct: bool = False) -> str:
        return "-" if v is None else (f"{100 * v:.2f}%" if pct else f"{v:.3e}")

    return (r.backend, r.device or "-", t(r.encode, "cold_s"), t(r.encode, "warm_s"), t(r.encode, "compute_bytes"),
            t(r.decode, "cold_s"), t(r.decode, "warm_s"), t(r.decode, "compute_bytes"), r.decode_path or "-",
            e(r.decode_max_abs), e(r.decode_rel_rms), e(r.codes_agreement, pct=True))


def bench_signal(n: int, rate: int, seed: int = 0) -> np.ndarray:
    """Noise plus two tones, amplitude well inside [-1, 1], float32 (n,)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    x = 0.2 * rng.standard_normal(n) + 0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 3000 * t)
    return x.astype(np.float32)


def _graph_bytes(codec, kinds: tuple[str, ...]) -> dict[str, int]:
    graphs = codec.engine.cached_graphs()
    return {f"{k[0]}:{k[1]}": int(g.compute_bytes) for k, g in graphs.items() if k[0] in kinds}


def _time(codec, call: Callable[[], Any], repeats: int, kinds: tuple[str, ...]) -> tuple[Any, Timing]:
    # Cold: no graph of this direction cached. Only those are dropped (none, on the first
    # measurement of a codec): on lavapipe their buffers stay parked until close (Backend.release).
    codec.engine.discard(*[k for k in codec.engine.cached_graphs() if k[0] in kinds])
    t0 = time.perf_counter()
    out = call()
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        warm.append(time.perf_counter() - t0)
    graphs = _graph_bytes(codec, kinds)
    return out, Timing(cold, statistics.median(warm), sum(graphs.values()), graphs)


def _run_backend(name: str, model: Path, seconds: float, ref: dict[str, np.ndarray] | None,
                 repeats: int, precision: str, n_threads: int | None) -> tuple[BackendRow, dict[str, np.ndarray]]:
    """One backend's row; ``ref`` (None for the CPU run) holds the CPU's audio, codes and wave."""
    row = BackendRow(name)
    with load(model, backend=name, strict_backend=True, precision=precision,
                           n_threads=n_threads) as codec:
        row.device = codec.device_name
        rate = codec.sample_rate
        audio = bench_signal(max(1, int(round(seconds * rate))), rate) if ref is None else ref["signal"]
        codes, row.encode = _time(codec, lambda: codec.encode(audio), repeats, ENCODE_GRAPHS)
        dec_in = codes if ref is None else ref["codes"]
        wave, row.decode = _time(codec, lambda: codec.decode(dec_in), repeats, DECODE_GRAPHS)
        row.decode_path = "fused" if any(k.startswith("fused:") for k in row.decode.graphs) else "split"
        row.lowerings = dict(codec.lowerings)
        row.products = codec.plan.products
    ref = ref or {"signal": audio, "codes": codes, "audio": wave}
    m = float_metrics(ref["audio"], wave)
    row.decode_max_abs, row.decode_rel_rms = m["max_abs"], m["rel_rms"]
    row.codes_agreement = min(code_agreement(ref["codes"], codes)) if codes.shape == ref["codes"].shape else 0.0
    return row, ref


def bench_backends(model: str | Path, seconds: float = 2.0, repeats: int = 3, precision: str = "f32",
                   n_threads: int | None = None, backends: list[str] | None = None) -> BenchResult:
    """Bench every backend of :func:`available_backends` (or ``backends``; CPU always first).

    A backend that fails to load or run gets a row with ``error`` set; the CPU failing
    raises, since every delta is measured against it.
    """
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"seconds must be > 0, got {seconds}")
    names = ["cpu"] + [b for b in (backends or available_backends()) if b != "cpu"]
    rows, ref = [], None
    for name in names:
        try:
            row, ref = _run_backend(name, Path(model), seconds, ref, repeats, precision, n_threads)
        except CodecError as exc:
            if name == "cpu":
                raise
            row = BackendRow(name, error=str(exc))
        rows.append(row)
    note = None
    if len(names) == 1:
        note = ("this ggml build has only the CPU backend (available_backends() == ['cpu']): "
                "ran on CPU only; its deltas are against itself")
    return BenchResult(str(model), float(seconds), precision, repeats, rows, note)
