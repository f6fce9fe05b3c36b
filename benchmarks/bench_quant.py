"""Quantized codec files at full S2 size, side by side in one run: error, speed, size, memory.

    python benchmarks/bench_quant.py                     # Q8_0, Q6_K, Q5_K, Q4_K; 10 s of audio
    python benchmarks/bench_quant.py --types q8_0 --seconds 2

Builds the full-size random-weight model (upstream classes from the oracle wheels, converted
to F32 and F16 files), quantizes the F16 file with ``pyggml-codec quantize`` to each type, and
measures every file against the F32 file in f32 precision (the reference), in one process:

* decode of the same random codes: relative RMS, max abs, log-mel distance (80 bands, mean
  |difference| of log10 power, in dB) and a multi-resolution STFT distance (spectral convergence
  plus mean |log magnitude difference| at FFT sizes 512 / 1024 / 2048), all numpy;
* encode of the same signal: code agreement per codebook on the frames whose reference margin is
  clear (> 1e-3), and overall;
* decode and encode time (median of --reps), file size, the decode weights' loaded bytes, and
  the peak RSS of a decode-only load (parts="decode") in a child process.

Random weights make these errors a lower bound on trouble, not a verdict on quality: with real
weights, run ``pyggml-codec compare`` on your own audio (a dump or decode of the F16 file against
the quantized one). Writes bench_out/quant.md and quant.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="+", default=["q8_0", "q6_k", "q5_k", "q4_k"])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench_out"))
    p.add_argument("--rss-child", nargs=3, metavar=("MODEL", "SECONDS", "QUANTIZED"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _mel_filters(rate: int, n_fft: int, n_mels: int = 80) -> np.ndarray:
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    hz = lambda m: 700 * (10 ** (m / 2595) - 1)  # noqa: E731
    edges = hz(np.linspace(mel(0), mel(rate / 2), n_mels + 2))
    bins = np.fft.rfftfreq(n_fft, 1 / rate)
    fb = np.zeros((n_mels, bins.size))
    for i in range(n_mels):
        lo, mid, hi = edges[i], edges[i + 1], edges[i + 2]
        fb[i] = np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0, None)
    return fb


def _stft_mag(x: np.ndarray, n_fft: int) -> np.ndarray:
    hop, win = n_fft // 4, np.hanning(n_fft)
    frames = np.lib.stride_tricks.sliding_window_view(np.pad(x.astype(np.float64), (n_fft // 2, n_fft // 2)), n_fft)
    return np.abs(np.fft.rfft(frames[::hop] * win, axis=1))


def spectral_metrics(ref: np.ndarray, got: np.ndarray, rate: int = 44100) -> dict[str, float]:
    """Log-mel distance (dB) and multi-resolution STFT distance of ``got`` against ``ref``."""
    fb = _mel_filters(rate, 2048)
    power = lambda x: fb @ (_stft_mag(x, 2048) ** 2).T  # noqa: E731
    logmel = float(np.mean(np.abs(10 * np.log10(power(ref) + 1e-10) - 10 * np.log10(power(got) + 1e-10))))
    mrstft = 0.0
    for n_fft in (512, 1024, 2048):
        a, b = _stft_mag(ref, n_fft), _stft_mag(got, n_fft)
        mrstft += np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-12) + np.mean(np.abs(np.log(a + 1e-7) - np.log(b + 1e-7)))
    return {"logmel_db": logmel, "mrstft": float(mrstft / 3)}


def _timed(fn, reps: int) -> tuple[object, float]:
    out, times = None, []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def rss_child(model: str, seconds: float, quantized: str) -> None:
    import pyggml_codec
    from parity import random_codes

    with pyggml_codec.load(model, "cpu", n_threads=2, parts="decode", lowerings={"quantized": quantized}) as c:
        c.decode(random_codes(c.config.quantizer.codebook_sizes, -(-int(seconds * 44100) // 2048), seed=2))
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    print(json.dumps({"peak_rss_mb": peak}))


def measure(path: Path, ref: dict | None, args, quantized: str = "native") -> dict:
    import pyggml_codec
    from parity import random_codes, signal

    n = int(args.seconds * 44100)
    with pyggml_codec.load(path, "cpu", n_threads=args.threads, lowerings={"quantized": quantized}) as c:
        codes = random_codes(c.config.quantizer.codebook_sizes, -(-n // 2048), seed=2)
        x = signal(n, seed=1)
        c.decode(codes[:, :4]), c.encode(x[:4096])  # warm: graphs for the first sizes
        wave, t_dec = _timed(lambda: c.decode(codes), args.reps)
        (enc, margins), t_enc = _timed(lambda: (lambda r: (r.codes, r.margins))(c.encode_details(x)), args.reps)
        row = {"file": path.name, "quantized": quantized, "mb": path.stat().st_size / 1e6,
               "decode_s": t_dec, "encode_s": t_enc, "lowering": c.lowerings.get("quantized", "-")}
    rss = subprocess.run([sys.executable, __file__, "--rss-child", str(path), str(args.seconds), quantized],
                         capture_output=True, text=True, check=True)
    row["decode_rss_mb"] = json.loads(rss.stdout.strip().splitlines()[-1])["peak_rss_mb"]
    if ref is None:
        return {**row, "wave": wave, "codes": enc, "margins": margins}
    err = wave - ref["wave"]
    row["rel_rms"] = float(np.sqrt(np.mean(err ** 2) / np.mean(ref["wave"] ** 2)))
    row["max_abs"] = float(np.abs(err).max())
    row.update(spectral_metrics(ref["wave"], wave))
    clear = ref["margins"] > 1e-3
    row["codes_clear"] = float(np.mean((enc == ref["codes"])[clear]))
    row["codes_all"] = float(np.mean(enc == ref["codes"]))
    return row


def table(rows: list[dict]) -> str:
    head = ("| file | products | MB | decode s | encode s | decode RSS MB | rel RMS | max abs | log-mel dB "
            "| MR-STFT | codes (clear) | codes (all) |\n|" + "---|" * 12)
    out = [head]
    for r in rows:
        f = lambda k, fmt: (fmt % r[k]) if k in r else "ref"  # noqa: E731
        out.append(f"| {r['file']} | {r['lowering']} | {r['mb']:.0f} | {r['decode_s']:.2f} | {r['encode_s']:.2f} | "
                   f"{r['decode_rss_mb']:.0f} | {f('rel_rms', '%.2e')} | {f('max_abs', '%.2e')} | "
                   f"{f('logmel_db', '%.3f')} | {f('mrstft', '%.4f')} | {f('codes_clear', '%.4f')} | "
                   f"{f('codes_all', '%.4f')} |")
    return "\n".join(out)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child[0], float(args.rss_child[1]), args.rss_child[2])
        return 0
    import models
    import oracle
    from pyggml_codec.model.quantize import quantize_file

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = oracle.build_model(oracle.FULL, seed=0)
        paths = {d: models.make_gguf(model, tmp / f"s2_{d}.gguf", d) for d in ("f32", "f16")}
        del model
        for t in args.types:
            print(quantize_file(paths["f16"], tmp / f"s2_{t}.gguf", t).summary().splitlines()[0], flush=True)
        ref = measure(paths["f32"], None, args)
        rows = [{k: v for k, v in ref.items() if k not in ("wave", "codes", "margins")}]
        for name in ["f16"] + args.types:
            path = paths.get(name, tmp / f"s2_{name}.gguf")
            for mode in (("native", "dequantize") if name in args.types else ("native",)):
                rows.append(measure(path, ref, args, mode))
                print(json.dumps(rows[-1]), flush=True)
    import platform

    from pyggml_codec.backend import binding

    machine = f"{platform.processor() or platform.machine()}, {args.threads} threads, ggml {binding.ggml_version()}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quant.json").write_text(json.dumps({"machine": machine, "seconds": args.seconds, "rows": rows}, indent=2))
    md = f"Machine: {machine}; {args.seconds:g} s of audio; reference: the F32 file in f32 precision.\n\n{table(rows)}\n"
    (args.out / "quant.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
