"""A playback loop: decode codes a few frames at a time and append each chunk to a wav.

Uses the exact stateful ``codec.stream_decoder()`` when this version has it; otherwise it
decodes growing windows with ``codec.decode`` and emits only the new samples.

    python examples/streaming_playback.py --model s2-pro-codec.gguf --codes speech.npz
    python examples/streaming_playback.py       # no files: the tiny demo model and a tone
"""

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

import pyggml_codec
from pyggml_codec.io.codefiles import read_codes
from pyggml_codec.demo import build_demo_model

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", type=Path, help="codec GGUF (default: build the tiny demo model)")
parser.add_argument("--codes", type=Path, help="code file (.npz/.npy/.s2voice); default: encode a tone")
parser.add_argument("--output", type=Path, help="wav to write (default: stream.wav in a temp folder)")
parser.add_argument("--chunk", type=int, default=4, help="frames per step (4 = about 186 ms)")
parser.add_argument("--seconds", type=float, default=2.0, help="length of the tone when no --codes")
args = parser.parse_args()

work = Path(tempfile.mkdtemp(prefix="pyggml_example_"))
model = args.model or build_demo_model(work)
output = args.output or work / "stream.wav"
with pyggml_codec.load(model) as codec:
    rate, spf = codec.config.sample_rate, codec.config.samples_per_frame
    if args.codes:
        codes = read_codes(args.codes).codes
    else:
        codes = codec.encode((0.5 * np.sin(2 * np.pi * 330 * np.arange(int(args.seconds * rate)) / rate)).astype(np.float32))
    n = codes.shape[1]
    stream = codec.stream_decoder() if hasattr(codec, "stream_decoder") else None
    start = time.perf_counter()
    with sf.SoundFile(output, "w", samplerate=rate, channels=1, subtype="FLOAT") as out:
        for i in range(0, n, args.chunk):
            j = min(i + args.chunk, n)
            if stream is not None:
                pcm = stream.push(codes[:, i:j])  # exactly the audio of frames i..j-1
            else:  # causal model: re-decode 0..j and keep the new part
                pcm = codec.decode(codes[:, :j])[i * spf:]
            out.write(pcm)  # a player would queue pcm here
            print(f"frames {i:4d}-{j - 1:4d}: {len(pcm)} samples, {time.perf_counter() - start:.3f} s elapsed")
print(f"wrote {output}: {n * spf / rate:.2f} s ({'stream_decoder' if stream else 'windowed decode'})")
