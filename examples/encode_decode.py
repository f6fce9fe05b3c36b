"""Encode an audio file (or a generated tone) to codes, decode them, write a wav.

    python examples/encode_decode.py --model s2-pro-codec.gguf --input speech.wav --output out.wav
    python examples/encode_decode.py            # no files: the tiny random-weight demo model
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np

import pyggml_codec
from pyggml_codec.io.audio import read_audio, resample, write_audio
from pyggml_codec.io.codefiles import CodeFile, write_codes
from pyggml_codec.demo import build_demo_model

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", type=Path, help="codec GGUF (default: build the tiny demo model)")
parser.add_argument("--input", type=Path, help="audio file (default: a 2 s 440 Hz tone)")
parser.add_argument("--output", type=Path, help="wav to write (default: decoded.wav in a temp folder)")
args = parser.parse_args()

work = Path(tempfile.mkdtemp(prefix="pyggml_example_"))
model = args.model or build_demo_model(work)
output = args.output or work / "decoded.wav"
with pyggml_codec.load(model) as codec:
    rate = codec.config.sample_rate
    if args.input:
        x, src_rate, _ = read_audio(args.input)  # mono float32, channels averaged
        x = resample(x, src_rate, rate, method="soxr") if src_rate != rate else x
    else:
        x = (0.5 * np.sin(2 * np.pi * 440 * np.arange(2 * rate) / rate)).astype(np.float32)
    codes = codec.encode(x)  # (n_codebooks, ceil(n / samples_per_frame)) int32
    write_codes(work / "codes.npz", CodeFile(codes, sample_rate=rate, n_samples=len(x)))
    wave = codec.decode(codes)[: len(x)]  # drop the padding of the last code frame
    write_audio(output, wave, rate)
    print(f"{len(x) / rate:.2f} s -> codes {codes.shape} -> {output} (backend {codec.backend_name})")
if args.model is None:
    print("random demo weights: the output is noise; pass --model with a real S2 Pro GGUF for speech")
