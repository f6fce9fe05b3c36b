"""Stage dumps from the upstream PyTorch codec, with the stage names of pyggml_codec's dumps.

Test tooling: needs torch and the upstream wheels (env ``PYGGML_ORACLE_WHEELS``, see
``tests/oracle_shim.py``). A GGUF alone is not enough, since the reference needs the torch
model, so the model is rebuilt from a preset and a seed exactly as ``tests/oracle.build_model``
builds it (the test suite's ``tiny_model`` is ``--preset tiny --seed 0``); ``--write-gguf``
also writes its conversion, for ``Codec.dump_decode`` / ``dump_encode`` to run on.

    python tools/reference_dump.py --preset tiny --seed 0 --random-seconds 1 -o ref_dec.npz \\
        --write-gguf tiny.gguf
    python tools/reference_dump.py --preset tiny --seed 0 --audio in.wav -o ref_enc.npz
    python -m pyggml_codec compare ref_enc.npz ours_enc.npz

Every stage is computed by the upstream submodules themselves: ``model.encoder.block[i]``,
``quantizer.downsample[i]``, ``quantizer.pre_module``, each ``VectorQuantize`` of the
residual loop, ``from_codes`` of both RVQs (``dec.vq_sum``), ``post_module``,
``upsample[i]``, ``model.decoder.model[i]``. Orientation: torch ``(B, C, T)`` becomes numpy
``(C, T)`` by dropping the batch axis, which is the dump layout for every float stage
(``dec.pre_tanh`` is ``(1, n)``, ``audio`` ``(n,)``, ``enc.vq{i}.codes`` ``(T,)``); the
metadata records it per stage.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"


def _import_by_path(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_modules():
    """(oracle, models) from tests/, imported by path (tests/ is put on sys.path for their imports)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    oracle = sys.modules.get("oracle") or _import_by_path("oracle", TESTS / "oracle.py")
    models = sys.modules.get("models") or _import_by_path("models", TESTS / "models.py")
    return oracle, models


def build_model(preset: str, seed: int, rope_bf16: bool = False):
    """The upstream model of ``oracle.TINY``/``oracle.FULL`` with weights drawn from ``seed``."""
    oracle, _ = test_modules()
    cfg = {"tiny": oracle.TINY, "full": oracle.FULL}[preset]
    return oracle.build_model(cfg, seed, rope_f32=not rope_bf16)


def _np(t) -> np.ndarray:
    """torch (1, C, T) -> numpy (C, T), float32 (int64 for codes)."""
    return t.detach()[0].cpu().numpy()


def reference_decode_stages(model, codes: np.ndarray) -> dict[str, np.ndarray]:
    """Every decode stage of upstream for codes ``(n_codebooks, T)``, in dump order and layout."""
    import torch

    q = model.quantizer
    out: dict[str, np.ndarray] = {"codes": np.asarray(codes).astype(np.int32)}
    idx = torch.from_numpy(np.asarray(codes, dtype=np.int64).copy())[None]  # (1, K, T)
    with torch.inference_mode():  # the clamp of DownsampleResidualVectorQuantize.decode
        idx = torch.cat([idx[:, :1].clamp(max=q.semantic_quantizer.codebook_size - 1),
                         idx[:, 1:].clamp(max=q.quantizer.codebook_size - 1)], dim=1)
        x = q.semantic_quantizer.from_codes(idx[:, :1])[0] + q.quantizer.from_codes(idx[:, 1:])[0]
        out["dec.vq_sum"] = _np(x)
        x = q.post_module(x)
        out["dec.post_module"] = _np(x)
        for i, stage in enumerate(q.upsample):
            x = stage(x)
            out[f"dec.upsample{i}"] = _np(x)
        out["dec.latent"] = out[f"dec.upsample{len(q.upsample) - 1}"]
        layers = list(model.decoder.model)  # [stem, blocks..., Snake, conv, Tanh]
        n_blocks = len(layers) - 4
        for i, layer in enumerate(layers):
            x = layer(x)
            if 1 <= i <= n_blocks:
                out[f"dec.block{i}"] = _np(x)
            elif i == len(layers) - 2:
                out["dec.pre_tanh"] = _np(x)  # (1, n)
        out["audio"] = _np(x)[0]
    return out


def reference_encode_stages(model, audio: np.ndarray, multiple: int) -> dict[str, np.ndarray]:
    """Every encode stage of upstream for mono ``audio`` zero-padded to ``multiple``."""
    import torch

    oracle, _ = test_modules()
    q = model.quantizer
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    out: dict[str, np.ndarray] = {"audio": audio}
    with torch.inference_mode():
        x = oracle._pad_to(audio, multiple)  # (1, 1, N)
        blocks = list(model.encoder.block)  # [stem, blocks..., Snake, conv]
        n_blocks = len(blocks) - 3
        for i, layer in enumerate(blocks):
            x = layer(x)
            if 1 <= i <= n_blocks:
                out[f"enc.block{i}"] = _np(x)
        out["latent"] = _np(x)
        for i, stage in enumerate(q.downsample):
            x = stage(x)
            out[f"enc.downsample{i}"] = _np(x)
        residual = q.pre_module(x)  # channels_first: (1, D, T)
        out["pre_module"] = _np(residual)
        codes = []
        for i, vq in enumerate(oracle._stages(model)):
            out[f"enc.vq{i}.residual"] = _np(residual)
            z_q, _, _, idx, _ = vq(residual)
            out[f"enc.vq{i}.codes"] = idx[0].numpy().astype(np.int32)
            codes.append(out[f"enc.vq{i}.codes"])
            residual = residual - z_q
        out["codes"] = np.stack(codes)
    return out


def layouts(stages: dict[str, np.ndarray]) -> dict[str, str]:
    """The per-stage layout notes written to the dump's metadata."""
    def note(name: str, a: np.ndarray) -> str:
        if name == "codes":
            return "K,T"
        if a.ndim == 1:
            return "n (torch (B, 1, n)[0, 0])" if name == "audio" else "T (torch (B, T)[0])"
        return "C,T (torch (B, C, T)[0])"

    return {n: note(n, a) for n, a in stages.items()}


def _read_codes(path: Path) -> np.ndarray:
    from pyggml_codec.io.codefiles import read_codes

    return read_codes(path).codes


def _read_audio(path: Path, rate: int) -> np.ndarray:
    import soundfile as sf

    data, file_rate = sf.read(str(path), dtype="float32", always_2d=True)
    if file_rate != rate:
        raise SystemExit(f"reference_dump: error: {path} is {file_rate} Hz; the model needs {rate} Hz")
    return data.mean(axis=1).astype(np.float32) if data.shape[1] > 1 else data[:, 0].copy()


def _random_inputs(cfg, seconds: float, seed: int, direction: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = max(1, int(round(seconds * cfg.sample_rate)))
    if direction == "encode":
        return (0.2 * rng.standard_normal(n)).astype(np.float32)
    sizes = (cfg.semantic_codebook_size,) + (cfg.residual_codebook_size,) * cfg.residual_codebooks
    frames = math.ceil(n / cfg.samples_per_code_frame)
    return np.stack([rng.integers(0, s, frames) for s in sizes]).astype(np.int64)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="reference_dump", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=("tiny", "full"), default="tiny", help="oracle.TINY or oracle.FULL")
    p.add_argument("--seed", type=int, default=0, help="weight seed (oracle.build_model)")
    p.add_argument("--rope-bf16", action="store_true", help="upstream's own bfloat16 RoPE table (default float32)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--codes", type=Path, help="code file (.npy, .npz, .s2voice): a decode dump")
    src.add_argument("--audio", type=Path, help="audio file at the model's rate: an encode dump")
    src.add_argument("--random-seconds", type=float, help="random input of this length (see --direction)")
    p.add_argument("--direction", choices=("decode", "encode"), default="decode",
                   help="with --random-seconds: random codes (decode, default) or noise (encode)")
    p.add_argument("--input-seed", type=int, default=0, help="seed of --random-seconds inputs")
    p.add_argument("--pad-to", choices=("code_frame", "frame_length"), default="code_frame",
                   help="encode padding: 2048 samples (upstream, default) or 512 (the C++ engine)")
    p.add_argument("--save-input", type=Path, default=None, help="also write the input (.npy codes or .wav)")
    p.add_argument("--write-gguf", type=Path, default=None, metavar="PATH", help="also write the converted GGUF")
    p.add_argument("--gguf-dtype", choices=("f32", "f16"), default="f32")
    p.add_argument("-o", "--output", type=Path, required=True, help="dump to write (.npz)")
    return p.parse_args(argv)


def make_reference_dump(model, inputs: np.ndarray, direction: str, path: Path, pad_to: str = "code_frame",
                        extra_meta: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Compute the reference stages for ``inputs`` and write them to ``path``; returns them."""
    import torch

    from pyggml_codec import __version__
    from pyggml_codec.io.dumps import save_dump

    cfg = model.oracle_config
    if direction == "decode":
        stages = reference_decode_stages(model, inputs)
    else:
        # frame_length: the converter writes none, so the codec uses its default, 512
        multiple = cfg.samples_per_code_frame if pad_to == "code_frame" else 512
        stages = reference_encode_stages(model, inputs, multiple)
    meta = {
        "format": "pyggml_codec.dump", "format_version": 1, "kind": direction,
        "producer": "upstream torch (fish-speech 0.1.0, descript-audio-codec 1.0.0 wheels)",
        "library_version": __version__, "torch_version": torch.__version__, "backend": "torch-cpu",
        "precision": "float32", "sample_rate": cfg.sample_rate, "samples_per_frame": cfg.samples_per_code_frame,
        "orientation": "torch (B, C, T) -> numpy (C, T): batch axis dropped, no transposes",
        **({"pad_to": pad_to} if direction == "encode" else {}), **(extra_meta or {}),
        "layout": layouts(stages),
    }
    save_dump(path, stages, meta)
    return stages


def main(argv=None) -> int:
    args = parse_args(argv)
    _, models = test_modules()
    model = build_model(args.preset, args.seed, args.rope_bf16)
    cfg = model.oracle_config
    if args.codes is not None:
        direction, inputs = "decode", _read_codes(args.codes)
    elif args.audio is not None:
        direction, inputs = "encode", _read_audio(args.audio, cfg.sample_rate)
    else:
        direction = args.direction
        inputs = _random_inputs(cfg, args.random_seconds, args.input_seed, direction)
    if args.save_input is not None:
        _save_input(args.save_input, inputs, direction, cfg.sample_rate)
    gguf = None
    if args.write_gguf is not None:
        gguf = str(models.make_gguf(model, args.write_gguf, args.gguf_dtype))
    make_reference_dump(model, inputs, direction, args.output, args.pad_to, {
        "preset": args.preset, "seed": args.seed, "rope_table": "bfloat16" if args.rope_bf16 else "float32",
        "model_file": gguf})
    print(args.output)
    return 0


def _save_input(path: Path, inputs: np.ndarray, direction: str, rate: int) -> None:
    if direction == "decode":
        np.save(path, inputs.astype(np.int64))
    else:
        import soundfile as sf

        sf.write(str(path), inputs, rate, subtype="FLOAT")


if __name__ == "__main__":
    sys.exit(main())
