"""Stage-by-stage comparison of two dumps, two code files or two audio files.

Metrics per stage, A taken as the reference:

* ``max_abs``  max |A - B|
* ``rel_rms``  rms(A - B) / rms(A)   (0 when both are all zeros, inf when only A is)
* ``cosine``   <A, B> / (|A| |B|)     (1 when both are all zeros)
* ``snr_db``   10 log10(sum A^2 / sum (A - B)^2)  (inf when identical)
* integer (code) stages: ``agreement``, the fraction of equal entries per codebook row

Default tolerances (:data:`DEFAULT_TOLERANCES`): rel RMS <= 1e-3 for float stages (the
s2cpp precision's F16 conv inputs sit near 5e-4; f32 sits near 1e-7), 100 % agreement for
codes; ``max_abs`` is unchecked unless given. Overrides are a mapping of the same metric
names, plus stage names (or ``fnmatch`` patterns such as ``"enc.vq*.codes"``) mapping to a
mapping of their own, e.g. ``{"rel_rms": 1e-5, "dec.pre_tanh": {"rel_rms": 1e-4}}``.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import CodecError
from ..io.dumps import Dump, is_dump, load_dump
from ..io.codefiles import read_codes

DEFAULT_TOLERANCES: dict[str, float | None] = {"rel_rms": 1e-3, "agreement": 1.0, "max_abs": None}
METRICS = tuple(DEFAULT_TOLERANCES)
KIND_NAMES = {"dump": "a stage dump", "codes": "a code file", "audio": "an audio file"}
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3", ".aiff", ".aif", ".au", ".caf")


class CompareError(CodecError, ValueError):
    """Two inputs cannot be compared: unreadable, of different kinds, or with no common stage."""


class CompareUsageError(CompareError):
    """The two inputs are of different kinds (a usage error, exit status 2 in the CLI)."""


# --------------------------------------------------------------------------- metrics


def float_metrics(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """max_abs, rel_rms, cosine and snr_db of B against the reference A (same shape)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    d = a - b
    ea, eb, ed = float(a @ a), float(b @ b), float(d @ d)
    rel = math.sqrt(ed / ea) if ea > 0 else (0.0 if ed == 0 else math.inf)
    if ea > 0 and eb > 0:
        cos = float(a @ b) / math.sqrt(ea * eb)
    else:
        cos = 1.0 if ea == eb else 0.0
    snr = math.inf if ed == 0 else (10 * math.log10(ea / ed) if ea > 0 else -math.inf)
    return {"max_abs": float(np.max(np.abs(d))) if d.size else 0.0, "rel_rms": rel, "cosine": cos, "snr_db": snr}


def code_agreement(a: np.ndarray, b: np.ndarray) -> list[float]:
    """Fraction of equal entries per codebook row ((K, T) -> K values; (T,) -> 1 value)."""
    a, b = np.asarray(a), np.asarray(b)
    eq = a.reshape(-1, a.shape[-1]) == b.reshape(-1, b.shape[-1])
    return [float(row.mean()) if row.size else 1.0 for row in eq]


# --------------------------------------------------------------------------- tolerances


def resolve_tolerances(overrides: Mapping[str, Any] | None) -> "Tolerances":
    """Validate ``overrides`` (see the module docstring) against the defaults."""
    base = dict(DEFAULT_TOLERANCES)
    per_stage: dict[str, dict[str, float | None]] = {}
    for key, value in (overrides or {}).items():
        if key in METRICS:
            base[key] = _tolerance_value(key, value)
        elif isinstance(value, Mapping):
            per_stage[key] = {m: _tolerance_value(f"{key}.{m}", v) for m, v in value.items() if _metric(m)}
        else:
            raise ValueError(f"tolerance {key!r}: not a metric ({', '.join(METRICS)}) nor a stage with a mapping")
    return Tolerances(base, per_stage)


def _metric(name: str) -> bool:
    if name not in METRICS:
        raise ValueError(f"unknown tolerance metric {name!r}; use one of {', '.join(METRICS)}")
    return True


def _tolerance_value(name: str, value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    if not v >= 0 or math.isnan(v):
        raise ValueError(f"tolerance {name} must be >= 0, got {value!r}")
    return v


@dataclass(frozen=True)
class Tolerances:
    """Global limits and per-stage (or per-pattern) overrides; ``None`` = not checked."""

    default: dict[str, float | None]
    per_stage: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def for_stage(self, name: str) -> dict[str, float | None]:
        limits = dict(self.default)
        for pattern, values in self.per_stage.items():
            if name == pattern or fnmatch.fnmatchcase(name, pattern):
                limits.update(values)
        return limits


# --------------------------------------------------------------------------- the report


@dataclass
class StageResult:
    """One compared stage: its metrics, the limits applied and what went past them."""

    name: str
    kind: str  # "float", "codes" or "shape" (shapes differ: not comparable)
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    metrics: dict[str, Any]
    limits: dict[str, float | None]
    violations: list[str]

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class Report:
    """The comparison of B against the reference A, stage by stage in A's stage order."""

    a: str
    b: str
    kind: str  # "dump", "codes" or "audio"
    stages: list[StageResult]
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.stages)

    @property
    def first_failure(self) -> str | None:
        """The name of the first stage (in stage order) past a tolerance, or None."""
        return next((s.name for s in self.stages if not s.ok), None)

    def table(self) -> str:
        """A plain-text table, one row per stage, and a verdict line."""
        head = ("stage", "shape", "max_abs", "rel_rms", "cosine", "snr_db", "agree", "status")
        rows = [head] + [stage_row(s) for s in self.stages]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines += [f"only in A (not compared): {', '.join(self.only_in_a)}"] if self.only_in_a else []
        lines += [f"only in B (not compared): {', '.join(self.only_in_b)}"] if self.only_in_b else []
        lines.append(self.verdict())
        return "\n".join(lines)

    def verdict(self) -> str:
        if self.ok:
            return f"OK: {len(self.stages)} stage(s) within tolerance"
        bad = next(s for s in self.stages if not s.ok)
        return f"FAIL: first stage past tolerance: {bad.name} ({'; '.join(bad.violations)})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a, "b": self.b, "kind": self.kind, "ok": self.ok, "first_failure": self.first_failure,
            "only_in_a": self.only_in_a, "only_in_b": self.only_in_b,
            "stages": [{**asdict(s), "ok": s.ok} for s in self.stages],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON; non-finite numbers become the strings "inf", "-inf", "nan"."""
        return json.dumps(json_safe(self.to_dict()), indent=indent, allow_nan=False)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6f}" if 0.9 < v <= 1.0 else f"{v:.3e}" if math.isfinite(v) else str(v)
    return str(v)


def stage_row(s: StageResult) -> tuple[str, ...]:
    m = s.metrics
    shape = "x".join(map(str, s.shape_a)) if s.shape_a == s.shape_b else f"{s.shape_a} vs {s.shape_b}"
    agree = m.get("agreement")
    agree_s = "-" if agree is None else f"{100 * min(agree, default=1.0):.2f}%"
    snr = m.get("snr_db")
    snr_s = "-" if snr is None else (f"{snr:.1f}" if math.isfinite(snr) else str(snr))
    status = "ok" if s.ok else "FAIL"
    return (s.name, shape or "scalar", _fmt(m.get("max_abs")), _fmt(m.get("rel_rms")), _fmt(m.get("cosine")),
            snr_s, agree_s, status)


def json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


# --------------------------------------------------------------------------- comparing


def compare_stage(name: str, a: np.ndarray, b: np.ndarray, limits: dict[str, float | None]) -> StageResult:
    """Compare one stage; integer arrays are codes (agreement), everything else float."""
    a, b = np.asarray(a), np.asarray(b)
    sa, sb = tuple(a.shape), tuple(b.shape)
    if sa != sb:
        return StageResult(name, "shape", sa, sb, {}, limits, [f"shape {sa} vs {sb}"])
    is_codes = np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer)
    metrics: dict[str, Any] = float_metrics(a, b)
    violations = []
    if is_codes and a.ndim >= 1:
        metrics["agreement"] = code_agreement(a, b)
        worst = min(metrics["agreement"], default=1.0)
        if limits["agreement"] is not None and worst < limits["agreement"]:
            cbs = [i for i, x in enumerate(metrics["agreement"]) if x < limits["agreement"]]
            violations.append(f"agreement {100 * worst:.2f}% < {100 * limits['agreement']:.2f}% in codebook(s) {cbs}")
    elif limits["rel_rms"] is not None and not metrics["rel_rms"] <= limits["rel_rms"]:
        violations.append(f"rel_rms {metrics['rel_rms']:.3e} > {limits['rel_rms']:.1e}")
    if limits["max_abs"] is not None and not metrics["max_abs"] <= limits["max_abs"]:
        violations.append(f"max_abs {metrics['max_abs']:.3e} > {limits['max_abs']:.1e}")
    return StageResult(name, "codes" if is_codes else "float", sa, sb, metrics, limits, violations)


def compare(a: Any, b: Any, tolerances: Mapping[str, Any] | None = None) -> Report:
    """Compare B against the reference A: two dumps, two code files or two audio files.

    ``a``/``b``: paths (kind by content and extension: an ``.npz`` with ``__meta__`` is a
    dump, ``.npz``/``.npy``/``.s2voice`` otherwise code files, audio extensions audio) or
    in-memory dumps (:class:`pyggml_codec.io.dumps.Dump` or ``{stage: array}``).
    Stages are matched by name and reported in A's order. Raises :class:`CompareError`
    for unreadable inputs and :class:`CompareUsageError` for inputs of different kinds.
    """
    tol = resolve_tolerances(tolerances)
    kind_a, stages_a = load_comparable(a)
    kind_b, stages_b = load_comparable(b)
    if kind_a != kind_b:
        raise CompareUsageError(
            f"cannot compare {KIND_NAMES[kind_a]} ({_label(a)}) with {KIND_NAMES[kind_b]} ({_label(b)})")
    if kind_a == "audio":
        _check_rates(Path(a), Path(b))
    common = [n for n in stages_a if n in stages_b]
    if not common:
        raise CompareError(f"{_label(a)} and {_label(b)} have no stage in common")
    results = [compare_stage(n, stages_a[n], stages_b[n], tol.for_stage(n)) for n in common]
    return Report(_label(a), _label(b), kind_a, results,
                  only_in_a=[n for n in stages_a if n not in stages_b],
                  only_in_b=[n for n in stages_b if n not in stages_a])


def _label(x: Any) -> str:
    return str(x) if isinstance(x, (str, os.PathLike)) else type(x).__name__


def load_comparable(x: Any) -> tuple[str, dict[str, np.ndarray]]:
    """(kind, ordered {stage: array}) of a path or an in-memory dump."""
    if isinstance(x, Dump):
        return "dump", dict(x.stages)
    if isinstance(x, Mapping):
        return "dump", {str(k): np.asarray(v) for k, v in x.items()}
    if not isinstance(x, (str, os.PathLike)):
        raise TypeError(f"compare() takes paths or dumps, got {type(x).__name__}")
    path = Path(x)
    if not path.is_file():
        raise CompareError(f"{path}: no such file")
    ext = path.suffix.lower()
    if ext == ".npz" and is_dump(path):
        return "dump", dict(load_dump(path).stages)
    if ext in (".npz", ".npy", ".s2voice"):
        return "codes", {"codes": _read_code_file(path)}
    if ext in AUDIO_EXTENSIONS:
        return "audio", {"audio": _read_audio_file(path)}
    raise CompareError(f"{path}: unknown file kind {ext or '(no extension)'!r}: expected a dump (.npz), "
                       f"a code file (.npz, .npy, .s2voice) or audio ({', '.join(AUDIO_EXTENSIONS)})")


def _read_code_file(path: Path) -> np.ndarray:
    try:
        return read_codes(path).codes
    except (OSError, ValueError, KeyError, EOFError) as exc:
        text = str(exc)
        message = text if text.startswith(str(path)) else f"{path}: not a readable code file ({text})"
        raise CompareError(message) from None


def _check_rates(a: Path, b: Path) -> None:
    import soundfile as sf

    ra, rb = sf.info(str(a)).samplerate, sf.info(str(b)).samplerate
    if ra != rb:
        raise CompareError(f"sample rates differ: {a} is {ra} Hz, {b} is {rb} Hz (resample one first)")


def _read_audio_file(path: Path) -> np.ndarray:
    import soundfile as sf

    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)  # (n, channels)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError, OSError) as exc:
        raise CompareError(f"{path}: cannot decode audio ({exc})") from None
    data = data.T  # (channels, n): one row per channel, like a (C, T) stage
    return data[0] if data.shape[0] == 1 else data
