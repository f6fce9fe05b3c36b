"""Decode the same codes on every available backend; print the max abs difference vs CPU.

    python examples/compare_backends.py --model s2-pro-codec.gguf
    python examples/compare_backends.py         # no files: the tiny demo model
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np

import pyggml_codec
from pyggml_codec.demo import build_demo_model

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", type=Path, help="codec GGUF (default: build the tiny demo model)")
parser.add_argument("--frames", type=int, default=32, help="random code frames to decode")
args = parser.parse_args()

model = args.model or build_demo_model(tempfile.mkdtemp(prefix="pyggml_example_"))
with pyggml_codec.load(model, "cpu", parts="decode") as cpu:
    rng = np.random.default_rng(0)
    sizes = cpu.config.quantizer.codebook_sizes
    codes = np.stack([rng.integers(0, s, args.frames) for s in sizes]).astype(np.int32)
    reference = cpu.decode(codes)
print(f"cpu: {reference.shape[0]} samples (reference)")
for name in pyggml_codec.available_backends():
    if name == "cpu":
        continue
    with pyggml_codec.load(model, name, parts="decode", strict_backend=True) as codec:
        wave = codec.decode(codes)
    print(f"{name}: max abs diff vs cpu {np.max(np.abs(wave - reference)):.3e}")
if pyggml_codec.available_backends() == ["cpu"]:
    print("only the CPU backend is available in this ggml build; nothing to compare")
