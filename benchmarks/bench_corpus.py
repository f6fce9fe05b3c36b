"""Corpus encode throughput, side by side in one run: the CLI's directory mode against the Ray
Data job (dataset/ray_encode.py) at 1 and 2 actors, on the same corpus and model.

    python benchmarks/bench_corpus.py                    # full S2 size, 24 files of 5 s
    python benchmarks/bench_corpus.py --files 12 --seconds 3

Builds the full-size random-weight model (F16 file, as published), writes a corpus of speech-like
test signals (noise plus tones) at mixed rates, then times, each into a fresh output folder:
directory mode at 2 threads, Ray with 1 actor x 2 threads, Ray with 2 actors x 1 thread. Ray's
overhead per file is measured with the tiny model, where the encode itself costs ~10 ms: (Ray
wall - directory wall) / files, start-up included and excluded. Throughput is audio hours per
wall hour. Writes bench_out/corpus.md and corpus.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))


def write_corpus(root: Path, files: int, seconds: float) -> float:
    from parity import signal

    rates = (44100, 48000, 22050, 16000)
    for i in range(files):
        rate = rates[i % len(rates)]
        x = signal(int(seconds * rate), seed=i)
        path = root / f"spk{i % 4}" / f"utt{i:03d}.flac"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, x, rate)
    return files * seconds


def timed_cli(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pyggml_codec", *argv], check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def run_configs(model: Path, corpus: Path, out: Path, audio_s: float) -> list[dict]:
    base = ["encode", str(corpus), "-m", str(model), "-q", "--backend", "cpu"]
    configs = [("directory mode, 2 threads", ["--threads", "2"]),
               ("Ray, 1 actor x 2 threads", ["--ray", "--actors", "1", "--threads", "2"]),
               ("Ray, 2 actors x 1 thread", ["--ray", "--actors", "2", "--threads", "1"])]
    rows = []
    for i, (label, extra) in enumerate(configs):
        wall = timed_cli(base + ["-o", str(out / f"run{i}")] + extra)
        rows.append({"config": label, "wall_s": wall, "audio_h_per_h": audio_s / wall})
        print(json.dumps(rows[-1]), flush=True)
    same = all(_bytes(out / f"run{i}") == _bytes(out / "run0") for i in (1, 2))
    rows.append({"config": "outputs byte-identical across the three", "value": same})
    return rows


def _bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.npz"))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=24)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=Path("bench_out"))
    args = p.parse_args(argv)
    import models
    import oracle
    from pyggml_codec.demo import build_demo_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        full = models.make_gguf(oracle.build_model(oracle.FULL, seed=0), tmp / "s2_f16.gguf", "f16")
        audio_s = write_corpus(tmp / "corpus", args.files, args.seconds)
        rows = run_configs(full, tmp / "corpus", tmp / "out_full", audio_s)
        tiny = build_demo_model(tmp)
        overhead = run_configs(tiny, tmp / "corpus", tmp / "out_tiny", audio_s)
    per_file = {r["config"]: (r["wall_s"] - overhead[0]["wall_s"]) / args.files for r in overhead[1:3]}
    report = {"files": args.files, "seconds_each": args.seconds, "full": rows, "tiny": overhead,
              "ray_overhead_s_per_file_incl_startup": per_file}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "corpus.json").write_text(json.dumps(report, indent=2))
    lines = [f"{args.files} files x {args.seconds:g} s ({audio_s:.0f} s of audio), full S2 size, F16 file, 2 cores",
             "", "| config | wall s | audio h per wall h |", "|---|---|---|"]
    lines += [f"| {r['config']} | {r['wall_s']:.1f} | {r['audio_h_per_h']:.1f} |" for r in rows[:3]]
    lines += ["", f"byte-identical outputs: {rows[3]['value']}", "",
              "Tiny model (Ray overhead): " + ", ".join(f"{r['config']} {r['wall_s']:.1f} s" for r in overhead[:3]),
              "overhead per file incl. Ray start-up: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in per_file.items())]
    (args.out / "corpus.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
