"""A tiny random-weight S2-layout model, written without torch, for demos, examples and CI.

The file has the full S2 Pro structure (4 encoder blocks, 2 downsample stages, windowed
RVQ transformers, 1 semantic + 9 residual codebooks) at toy widths. Its weights are
random, so decoded audio is noise-like whatever the input: a real S2 Pro GGUF is needed
for speech.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from ._version import __version__
from .api import load
from .io.audio import write_audio
from .io.codefiles import CodeFile, write_codes
from .model import layout as layout
from .model.gguf_write import MetaValue as WriteMeta
from .model.gguf_write import TensorData, write_gguf
from .model.config import CodecConfig
from .model.gguf_file import MetaValue
from .model.weights import TensorSpec, expected_tensors

DEMO_ARCH = "fish-speech-codec"
OUTPUT_GAIN = 0.005  # shrinks the decoder's last conv so tanh does not saturate (output std ~0.25)
# Toy widths; everything else (rates, codebook count, windows' roles) follows S2 Pro.
DEMO_STRUCTURE = {
    "encoder_dim": 4, "encoder_rates": [2, 4, 8, 8], "encoder_transformer_layers": [0, 0, 0, 1],
    "hop_length": 512, "latent_dim": 64,
    "decoder_dim": 64, "decoder_rates": [8, 8, 4, 2], "decoder_transformer_layers": [0, 0, 0, 0],
    "quantizer_input_dim": 64, "quantizer_codebook_dim": 8, "quantizer_residual_codebooks": 9,
    "quantizer_residual_codebook_size": 32, "quantizer_semantic_codebook_size": 64,
    "quantizer_downsample_factor": [2, 2],
    "transformer.n_local_heads": -1,
    "rvq_transformer.window_size": 8, "rvq_transformer.n_layer": 2, "rvq_transformer.n_head": 1,
    "rvq_transformer.feed_forward_length": 192, "rvq_transformer.n_local_heads": -1,
    "rvq_transformer.dim": 64,
}


def demo_metadata() -> dict[str, object]:
    """Every ``fish_speech.codec.*`` value (short keys) of the demo model."""
    return {**layout.DEFAULTS, **DEMO_STRUCTURE}


def _entries() -> list[WriteMeta]:
    return [WriteMeta(*entry) for entry in layout.metadata_entries(demo_metadata())]


def demo_config() -> CodecConfig:
    """The demo model's CodecConfig, read back through the library's own metadata parser."""
    meta = {}
    for m in _entries():
        name = m.vtype.name if m.vtype != GGUFValueType.ARRAY else f"ARRAY[{m.sub_type.name}]"
        meta[m.key] = MetaValue(m.value, name)
    return CodecConfig.from_metadata(meta)


def _random_tensor(spec: TensorSpec, rng: np.random.Generator, head: str) -> np.ndarray:
    """Scaled so activations stay O(1): fan-in scaling, unit Snake alphas and norms."""
    name, shape = spec.name, spec.shape
    if name.endswith(("alpha", "norm.weight")):
        return np.ones(shape, np.float32)
    if name.endswith((".bias", "norm.bias")):
        return (0.01 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("gamma"):
        return np.full(shape, 0.1, np.float32)
    if name.endswith("codebook.weight"):
        return rng.standard_normal(shape).astype(np.float32)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    if spec.role == "convT":  # (in, out, k): each output sums in * k / stride terms
        fan_in = shape[0] * 2
    scale = OUTPUT_GAIN if name == head else 1.0
    return (scale * rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(np.float32)


def build_demo_model(folder: str | os.PathLike, seed: int = 0, name: str = "demo_codec.gguf") -> Path:
    """Write the demo GGUF (F32, about 2.6 MB) into ``folder``; returns its path."""
    rng = np.random.default_rng(seed)
    specs = expected_tensors(demo_config())
    head = specs[-2].name  # the decoder's last conv, before tanh
    tensors = [TensorData(s.name, _random_tensor(s, rng, head)) for s in specs]
    return write_gguf(Path(folder) / name, DEMO_ARCH, _entries(), tensors)


# --------------------------------------------------------------------------- the ``demo`` command

NOTE = ("note: the demo model has RANDOM weights, so output.wav is noise whatever the input; "
        "a real S2 Pro GGUF is needed for speech (pyggml-codec fetch -o s2-codec.gguf, then encode/decode -m s2-codec.gguf)")
DEMO_FILES = ("demo_codec.gguf", "input.wav", "codes.npz", "output.wav")


def demo_signal(seconds: float, rate: int) -> np.ndarray:
    """A 220 Hz tone plus a 200 -> 2000 Hz chirp, peak about 0.6, float32 ``(n,)``."""
    t = np.arange(round(seconds * rate)) / rate
    chirp = np.sin(2 * np.pi * (200 * t + (1800 / (2 * max(seconds, 1e-9))) * t**2))
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.3 * chirp).astype(np.float32)


def run_demo(args) -> list[str]:
    """Build the demo model, encode and decode a generated signal, write the files, time it.
    Returns the summary's lines (the CLI prints them; this module never prints)."""
    import tempfile
    import time

    out = Path(args.output_dir) if args.output_dir else Path(tempfile.mkdtemp(prefix="pyggml_codec_demo_"))
    existing = [out / f for f in DEMO_FILES if (out / f).exists()]
    if existing and not args.force:
        raise FileExistsError(f"{existing[0]} exists (use --force to overwrite)")
    t0 = time.perf_counter()
    model_path = build_demo_model(out, seed=args.seed)
    t_build = time.perf_counter() - t0
    with load(model_path, backend=args.backend, device=args.device, n_threads=args.threads,
              precision=args.precision, strict_backend=args.strict_backend) as codec:
        cfg = codec.config
        x = demo_signal(args.seconds, cfg.sample_rate)
        write_audio(out / "input.wav", x, cfg.sample_rate)
        t0 = time.perf_counter()
        codes = codec.encode(x, pad_to=args.pad_to)
        t_enc = time.perf_counter() - t0
        write_codes(out / "codes.npz", CodeFile(codes, cfg.sample_rate, int(x.shape[0]), meta={
            "pad_to": args.pad_to, "library_version": __version__, "codebook_sizes": cfg.quantizer.codebook_sizes,
            "samples_per_frame": cfg.samples_per_frame}))
        t0 = time.perf_counter()
        wave = codec.decode(codes)[: x.shape[0]]
        t_dec = time.perf_counter() - t0
        write_audio(out / "output.wav", wave, cfg.sample_rate)
        backend = codec.backend_name
    seconds = x.shape[0] / cfg.sample_rate
    return [
        f"demo model  {model_path} (built in {t_build:.2f} s)",
        f"input       {out / 'input.wav'}: {seconds:.2f} s at {cfg.sample_rate} Hz",
        f"encode      {codes.shape[0]} x {codes.shape[1]} codes -> {out / 'codes.npz'}: "
        f"{t_enc:.3f} s ({seconds / t_enc:.1f}x real time, backend {backend})",
        f"decode      {out / 'output.wav'}: {t_dec:.3f} s ({seconds / t_dec:.1f}x real time)",
        NOTE,
    ]
