"""Self-contained HTML pages for ``compare``, ``s2cpp-compare`` and ``bench-backends`` (``--report``):
one ``.html`` file, every picture a base64 PNG (no URL, no script), so it opens offline.

* :func:`compare_page`: per-stage error (rel RMS, max abs; log scale; the first stage past tolerance
  marked), the two waveforms and B − A, log-mel spectrograms of each and of B − A (mel in numpy);
* :func:`s2cpp_page`: per-stage error of each direction against the C++ engine;
* :func:`bench_page`: times and compute memory per backend and direction, parity against the CPU.

Plotting needs matplotlib (``pip install 'pyggml_codec[plot]'``), imported only when a page is
drawn (Agg canvas, no pyplot); :func:`require_plotting` lets commands fail before long work.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .._version import __version__
from ..errors import CodecError
from ..io.dumps import is_dump, load_dump
from ..io.fileio import atomic_path
from .compare import load_comparable, stage_row

INSTALL_HINT = "pip install 'pyggml_codec[plot]'"
ZERO_NOTE = "identical (0) drawn on the bottom line"
FAIL_COLOR, OK_COLOR, A_COLOR, B_COLOR, D_COLOR = "#c0392b", "#2c3e50", "#1f77b4", "#ff7f0e", "#7b3294"


class PlotExtraMissing(CodecError, ImportError):
    """``--report`` was asked for but matplotlib (the ``[plot]`` extra) is not installed."""


def require_plotting() -> None:
    """Raise :class:`PlotExtraMissing` (naming the install line) when matplotlib cannot be imported."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as exc:
        raise PlotExtraMissing(f"--report needs matplotlib, which is not installed ({exc}): {INSTALL_HINT}") from None


def _figure(width: float, height: float):
    require_plotting()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return FigureCanvasAgg(Figure(figsize=(width, height), dpi=100, layout="constrained")).figure


def _log_range(values: np.ndarray, empty_lo: float) -> tuple[float, float]:
    """A decade below the least positive finite value and one above the greatest."""
    v = values[np.isfinite(values) & (values > 0)]
    if not v.size:
        return empty_lo, 1.0
    return 10 ** math.floor(math.log10(v.min())) / 10, 10 ** math.ceil(math.log10(v.max())) * 10


def _label_bars(ax, xs, ys, texts, dx: int = 3, **kw) -> None:
    for x, y, text in zip(xs, ys, texts):
        ax.annotate(text, (x, y), xytext=(dx, 0), textcoords="offset points", va="center", fontsize=7, **kw)


def first_divergent_index(report) -> int | None:
    """Index in ``report.stages`` of the first stage past tolerance, or None."""
    return next((i for i, s in enumerate(report.stages) if not s.ok), None)


def stage_error_figure(report, title: str = ""):
    """rel RMS and max |A-B| per stage on a log axis; zeros on the bottom line, the first
    stage past tolerance marked with a red line, failed stage names in red."""
    stages = report.stages
    fig = _figure(max(8.5, min(11.5, 4.5 + 0.3 * len(stages))), 4.6)
    ax = fig.add_subplot()
    x = np.arange(len(stages))
    series = {label: np.array([s.metrics.get(key, math.nan) for s in stages], dtype=float)
              for label, key in (("rel RMS", "rel_rms"), ("max |A−B|", "max_abs"))}
    lo, hi = _log_range(np.concatenate(list(series.values())), 1e-12)
    limits = np.array([s.limits.get("rel_rms") if s.kind == "float" else None for s in stages], dtype=float)
    for (label, v), marker, color in zip(series.items(), ("o", "s"), (A_COLOR, B_COLOR)):
        pos = np.isfinite(v) & (v > 0)
        ax.plot(x[pos], v[pos], marker, color=color, label=label, ms=6)
        zero = v == 0
        ax.plot(x[zero], np.full(zero.sum(), lo), marker, mfc="none", color=color, ms=6)
    top = [i for i, s in enumerate(stages)  # shapes differ, a digest differs, or A is all zeros
           if (not s.ok and not s.metrics) or any(np.isinf(v[i]) for v in series.values())]
    if top:
        ax.plot(top, [hi] * len(top), "x", color=FAIL_COLOR, ms=9, mew=2, label="differs (infinite or no metric)")
    lim_ok = np.isfinite(limits) & (limits > 0)
    if lim_ok.any():
        ax.plot(x[lim_ok], limits[lim_ok], "_", color="0.35", ms=14, mew=2, label="rel RMS tolerance")
    if (np.concatenate(list(series.values())) == 0).any():
        ax.plot([], [], "o", mfc="none", color="0.4", label=ZERO_NOTE)
    ax.set(yscale="log", ylim=(lo / 2, hi * 2), xlim=(-0.7, len(stages) - 0.3), ylabel="error of B against A (log)")
    ax.set_xticks(x, [s.name for s in stages], rotation=60, ha="right", fontsize=8)
    for tick, s in zip(ax.get_xticklabels(), stages):
        tick.set_color(OK_COLOR if s.ok else FAIL_COLOR)
    first = first_divergent_index(report)
    if first is not None:
        ax.axvline(first, color=FAIL_COLOR, lw=1.5, ls="--")
        ax.text(first, 1.01, f"first divergent: {stages[first].name}", transform=ax.get_xaxis_transform(),
                color=FAIL_COLOR, fontsize=9, va="bottom", ha="left" if first < 0.6 * len(stages) else "right")
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # outside: hides no point
    ax.set_title(title or "Per-stage error", fontsize=11, pad=18 if first is not None else 6)
    return fig


def _pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """Channel 0 of A and B (float64), cut to the shorter; the note says what was left out."""
    a, b = (np.asarray(x, np.float64) for x in (a, b))
    note = f" (channel 0 of {a.shape[0]})" if a.ndim > 1 and a.shape[0] > 1 else ""
    a, b = (x.reshape(-1, x.shape[-1])[0] for x in (a, b))
    if a.size != b.size:
        note += f" (lengths differ, {a.size} vs {b.size}: the first {min(a.size, b.size)} samples)"
    n = min(a.size, b.size)
    return a[:n], b[:n], note


def waveform_figure(a: np.ndarray, b: np.ndarray, rate: int, names: Sequence[str] = ("A", "B")):
    """A, B and B − A over time (B − A on its own scale)."""
    a, b, note = _pair(a, b)
    fig = _figure(11.5, 6.0)
    axes = fig.subplots(3, 1, sharex=True)
    peak = max(np.abs(a).max(initial=0), np.abs(b).max(initial=0)) or 1.0
    diff_title = f"B − A (own scale; max |B−A| = {np.abs(b - a).max(initial=0):.3e})"
    for ax, y, label, color in zip(axes, (a, b, b - a), (f"A: {names[0]}", f"B: {names[1]}", diff_title),
                                   (A_COLOR, B_COLOR, D_COLOR)):
        ax.plot(np.arange(a.size) / rate, y, color=color, lw=0.6)
        ax.set_ylabel("amplitude", fontsize=8)
        ax.set_title(label + note, fontsize=9, loc="left")
        ax.grid(True, alpha=0.3)
    for ax in axes[:2]:
        ax.set_ylim(-1.05 * peak, 1.05 * peak)
    axes[-1].set_xlabel("time (s)")
    return fig


_MEL_STEP = np.log(6.4) / 27.0  # Slaney: 200/3 Hz per mel below 1 kHz (15 mel), log steps above


def hz_to_mel(f):
    """Slaney's mel scale (linear below 1 kHz, logarithmic above), as librosa's default."""
    f = np.asarray(f, np.float64)
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-9) / 1000.0) / _MEL_STEP, f / (200.0 / 3))


def mel_to_hz(m):
    m = np.asarray(m, np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp(_MEL_STEP * (m - 15.0)), m * (200.0 / 3))


def mel_filterbank(rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) triangular filters, Slaney area-normalised."""
    fmax = rate / 2 if fmax is None else fmax
    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    lower = (freqs[None, :] - edges[:-2, None]) / np.diff(edges)[:-1, None]
    upper = (edges[2:, None] - freqs[None, :]) / np.diff(edges)[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def log_mel(x: np.ndarray, rate: int, n_fft: int = 2048, hop: int = 512, n_mels: int = 80,
            floor_db: float = -200.0) -> np.ndarray:
    """(n_mels, frames) log-mel power in dB of a mono signal (Hann window, centred frames)."""
    x = np.pad(np.asarray(x, np.float64), (n_fft // 2, n_fft - n_fft // 2))  # >= n_fft samples: >= 1 frame
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop]
    power = np.abs(np.fft.rfft(frames * np.hanning(n_fft + 1)[:-1], axis=1)) ** 2
    mel = mel_filterbank(rate, n_fft, n_mels) @ power.T
    return np.maximum(10 * np.log10(np.maximum(mel, 1e-30)), floor_db)


def spectrogram_figure(a: np.ndarray, b: np.ndarray, rate: int, names: Sequence[str] = ("A", "B")):
    """Log-mel of A and B (one shared dB scale) and of B − A (its own scale)."""
    a, b, note = _pair(a, b)
    mels = [log_mel(y, rate) for y in (a, b, b - a)]
    fig = _figure(11.5, 7.5)
    axes = fig.subplots(3, 1, sharex=True)
    top = max(mels[0].max(), mels[1].max())  # A and B share one scale, the difference has its own
    extent = (0, a.size / rate, 0, mels[0].shape[0])
    diff_label = "B − A" + (" (own scale)" if np.any(b - a) else " (identical: no energy)")
    for ax, m, label, vmax in zip(axes, mels, (f"A: {names[0]}", f"B: {names[1]}", diff_label),
                                  (top, top, mels[2].max())):
        im = ax.imshow(m, origin="lower", aspect="auto", extent=extent, cmap="magma", interpolation="nearest",
                       vmin=vmax - 80, vmax=vmax)
        ax.set_title(label + note, fontsize=9, loc="left")
        ax.set_ylabel("mel band", fontsize=8)
        fig.colorbar(im, ax=ax, label="dB", pad=0.01)
    axes[-1].set_xlabel(f"time (s); {mels[0].shape[0]} mel bands to {rate / 2000:g} kHz, 2048-point FFT, hop 512")
    return fig


def agreement_figure(stage):
    """Per-codebook code agreement (percent) of one code stage."""
    agree = np.asarray(stage.metrics.get("agreement", []), np.float64) * 100
    fig = _figure(max(5.0, min(11.5, 2 + 0.5 * agree.size)), 3.0)
    ax = fig.add_subplot()
    colors = [OK_COLOR if v >= 100 * (stage.limits.get("agreement") or 0) else FAIL_COLOR for v in agree]
    ax.bar(np.arange(agree.size), agree, color=colors)
    ax.set(ylim=(min(90.0, float(agree.min(initial=100)) - 5), 100.5), xticks=np.arange(agree.size),
           xlabel="codebook", ylabel="equal codes (%)", title=f"{stage.name}: code agreement per codebook")
    return fig


def bench_figure(result):
    """Warm and cold (graph build + compute) seconds per backend and direction, and compute MB."""
    rows = [r for r in result.rows if r.ok]
    fig = _figure(11.5, 4.2)
    ax_t, ax_m = fig.subplots(1, 2, width_ratios=(2, 1))
    labels = [f"{r.backend} {d}" for r in rows for d in ("encode", "decode")]
    timings = [getattr(r, d) for r in rows for d in ("encode", "decode")]
    y = np.arange(len(labels))
    ax_t.barh(y - 0.2, [t.warm_s for t in timings], 0.4, color=A_COLOR, label=f"warm (median of {result.repeats})")
    ax_t.barh(y + 0.2, [t.cold_s for t in timings], 0.4, color=B_COLOR, label="cold (build + first compute)")
    for attr, dy in (("warm_s", -0.2), ("cold_s", 0.2)):
        vals = [getattr(t, attr) for t in timings]
        _label_bars(ax_t, vals, y + dy, [f"{v:.3g} s" for v in vals])
    ax_t.set_yticks(y, labels, fontsize=8)
    ax_t.set(title=f"time per call ({result.seconds:g} s signal, precision {result.precision})",
             ylim=(len(y) - 0.5, -0.5), xlabel="seconds", xlim=(0, 1.2 * max([t.cold_s for t in timings], default=1)))
    ax_t.legend(fontsize=8, loc="lower right")
    mib = [t.compute_bytes / 2**20 for t in timings]
    ax_m.barh(y, mib, 0.5, color="0.5")
    _label_bars(ax_m, mib, y, [f"{m:.3g}" for m in mib])
    ax_m.set(xlim=(0, 1.25 * max(mib, default=1.0)), yticks=y, yticklabels=[""] * len(y), ylim=(len(y) - 0.5, -0.5),
             xlabel="compute buffers (MiB)", title="memory")
    return fig


def parity_figure(result):
    """Each backend's decode rel RMS and max abs against the CPU (log), and its code agreement."""
    rows = [r for r in result.rows if r.ok]
    fig = _figure(11.5, 3.4)
    ax_e, ax_c = fig.subplots(1, 2, width_ratios=(2, 1))
    y = np.arange(len(rows))
    vals = np.array([[r.decode_rel_rms or 0.0, r.decode_max_abs or 0.0] for r in rows], np.float64)
    lo, _ = _log_range(vals.ravel(), 1e-9)
    for j, (label, color, marker) in enumerate((("rel RMS", A_COLOR, "o"), ("max |Δ|", B_COLOR, "s"))):
        v = vals[:, j]
        yj = y + (0.12 if j else -0.12)  # the two metrics side by side: zeros do not hide each other
        ax_e.plot(v[v > 0], yj[v > 0], marker, color=color, label=label, ms=7)
        ax_e.plot(np.full((v == 0).sum(), lo), yj[v == 0], marker, mfc="white", color=color, ms=7)
    ax_e.set(xscale="log", xlim=(lo / 2, max(1.0, vals.max(initial=0) * 10)), yticks=y,
             yticklabels=[r.backend for r in rows], ylim=(len(rows) - 0.5, -0.5), title="decode parity")
    ax_e.set_xlabel(f"decode audio error against the CPU (log; {ZERO_NOTE.replace('bottom', 'left')})", fontsize=8)
    ax_e.legend(fontsize=8, loc="lower right")
    ax_e.grid(True, axis="x", alpha=0.3)
    agree = [100 * (r.codes_agreement if r.codes_agreement is not None else 0) for r in rows]
    ax_c.barh(y, agree, 0.5, color=[OK_COLOR if a >= 100 else FAIL_COLOR for a in agree])
    _label_bars(ax_c, agree, y, [f"{a:.2f}%" for a in agree], dx=-3, ha="right", color="white")
    ax_c.set(yticks=y, yticklabels=[""] * len(y), ylim=(len(rows) - 0.5, -0.5), xlim=(0, 100),
             xlabel="encode: codes equal to the CPU's (%)", title="encode parity")
    return fig


# --------------------------------------------------------------------------- HTML

_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1180px;color:#222}h1{font-size:1.4em}
h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}tr.fail td{color:#c0392b}pre{white-space:pre-wrap}
td:first-child,th:first-child,td:last-child,th:last-child{text-align:left}pre{font-size:12px}
.verdict{font-size:1.05em;padding:.4em .6em;border-left:4px solid}.ok{border-color:#27ae60}.bad{border-color:#c0392b}
img{max-width:100%;display:block;margin:.5em 0}dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}
dt{font-weight:bold}dd{margin:0}tr.first td{font-weight:bold;background:#fdecea}"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def img(fig, alt: str) -> str:
    """The figure as an ``<img>`` whose source is a ``data:image/png;base64`` URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode("ascii")}">'


def info_list(items: Mapping[str, Any]) -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items.items()) + "</dl>"


def verdict_block(report) -> str:
    first = report.first_failure
    attr = f' data-first-divergent="{_e(first)}"' if first else ""
    return f'<p class="verdict {"ok" if report.ok else "bad"}"{attr}>{_e(report.verdict())}</p>'


def stage_table(report) -> str:
    """One row per stage (the CLI table's columns); failed rows red, the first divergent bold."""

    head = ("stage", "shape", "max abs", "rel RMS", "cosine", "SNR dB", "agreement", "status", "why")
    first = report.first_failure
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for s in report.stages:
        cls = ("fail first" if s.name == first else "fail") if not s.ok else ""
        cells = list(stage_row(s)) + ["; ".join(s.violations)]
        out.append(f'<tr class="{cls}" data-stage="{_e(s.name)}">' + "".join(f"<td>{_e(c)}</td>" for c in cells)
                   + "</tr>")
    out.append("</table>")
    for side, names in (("A", report.only_in_a), ("B", report.only_in_b)):
        if names:
            out.append(f"<p>only in {side} (not compared): {_e(', '.join(names))}</p>")
    return "".join(out)


def stage_section(report, title: str) -> str:
    """Verdict, the per-stage error figure and the table of one :class:`~.compare.Report`."""
    parts = [verdict_block(report), img(stage_error_figure(report, title), f"per-stage error: {title}"),
             stage_table(report)]
    parts += [img(agreement_figure(s), f"code agreement {s.name}") for s in report.stages
              if s.kind == "codes" and min(s.metrics.get("agreement", [1.0]), default=1.0) < 1.0]
    return "".join(parts)


def html_page(title: str, body: Sequence[str]) -> str:

    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>{''.join(body)}"
            f"<p><small>pyggml_codec {_e(__version__)}</small></p></body></html>\n")


def write_page(path: str | os.PathLike, text: str) -> Path:
    """Write the page atomically (no half-written file on failure)."""
    with atomic_path(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


# --------------------------------------------------------------------------- the three pages


def _audio_and_rate(x: Any, stages: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, int | None]:
    """The float ``audio`` stage of a compared input and its sample rate (None when not recorded)."""
    import soundfile as sf


    audio = stages.get("audio")
    if audio is None or not np.issubdtype(np.asarray(audio).dtype, np.floating):
        return None, None
    if isinstance(x, (str, os.PathLike)):
        rate = load_dump(x).meta.get("sample_rate") if is_dump(x) else sf.info(str(x)).samplerate
    else:
        rate = getattr(x, "meta", {}).get("sample_rate")
    return np.asarray(audio), (int(rate) if rate else None)


def compare_page(report, a: Any, b: Any) -> str:
    """The page of ``compare(a, b)``: stage errors, waveforms and log-mel spectrograms."""

    (_, sa), (_, sb) = load_comparable(a), load_comparable(b)
    (wa, ra), (wb, rb) = _audio_and_rate(a, sa), _audio_and_rate(b, sb)
    body = [info_list({"A (reference)": report.a, "B": report.b, "kind": report.kind,
                       "stages compared": len(report.stages)}),
            "<h2>Per-stage error</h2>", stage_section(report, f"B against A, {len(report.stages)} stages")]
    if wa is None or wb is None:
        body.append("<h2>Audio</h2><p>No float <code>audio</code> stage in both inputs: "
                    "no waveform or spectrogram.</p>")
    else:
        rate = ra or rb or 44100
        note = "" if ra or rb else " Sample rate not recorded in either input: 44100 Hz assumed for the time axis."
        note += f" Sample rates differ ({ra} vs {rb} Hz): A's is used." if ra and rb and ra != rb else ""
        note += "" if np.any(np.subtract(*_pair(wa, wb)[:2])) else (
            " The audio of A and B is identical: B − A is zero (no energy in its spectrogram).")
        names = (report.a, report.b)
        body += ["<h2>Waveforms</h2>", f"<p>{_e(note.strip())}</p>" if note else "",
                 img(waveform_figure(wa, wb, rate, names), "waveforms A, B and B - A"),
                 "<h2>Log-mel spectrograms</h2>",
                 img(spectrogram_figure(wa, wb, rate, names), "log-mel spectrograms of A, B and B - A")]
    return html_page("pyggml-codec compare", body)


def s2cpp_page(reports: Mapping[str, Any], info: Mapping[str, Any] | None = None) -> str:
    """The page of ``s2cpp-compare``: per direction, each stage of this library against s2.cpp."""
    body = [info_list(info)] if info else []
    for kind, report in reports.items():
        body += [f"<h2>{_e(kind)}: {_e(report.b)} against {_e(report.a)}</h2>",
                 stage_section(report, f"{kind}: {report.b} against {report.a} (tolerance: bit for bit)")]
    return html_page("pyggml-codec s2cpp-compare", body)


def bench_page(result) -> str:
    """The page of ``bench-backends``: timing bars per backend and direction, parity against the CPU."""
    body = [info_list({"model": result.model, "signal": f"{result.seconds:g} s", "precision": result.precision,
                       "warm runs": result.repeats, "backends": ", ".join(r.backend for r in result.rows)})]
    if result.note:
        body.append(f"<p>{_e(result.note)}</p>")
    body += [f'<p class="verdict bad">{_e(r.backend)}: FAILED: {_e(r.error)}</p>' for r in result.rows if not r.ok]
    if any(r.ok for r in result.rows):
        body += ["<h2>Timing</h2>", img(bench_figure(result), "timing per backend and direction"),
                 "<h2>Parity against the CPU</h2>", img(parity_figure(result), "parity against the CPU")]
    body += ["<h2>Table</h2>", f"<pre>{_e(result.table())}</pre>"]
    return html_page("pyggml-codec bench-backends", body)
