"""Convert an upstream codec checkpoint to GGUF, or extract the codec from a merged GGUF.

Weight transformations happen here and only here:

- weight norm is folded: ``w = g * v / ||v||`` with the norm over every dim but 0 (torch
  ``weight_norm(dim=0)``; for a conv-transpose, dim 0 is the INPUT channel). Both the
  parametrization layout (``X.parametrizations.weight.original0`` = g, ``original1`` = v,
  used by the codec convs) and the legacy one (``X.weight_g`` / ``X.weight_v``, used by the
  VQ in_proj/out_proj of descript-audio-codec) are accepted;
- buffers (``freqs_cis``, ``causal_mask``, KV caches) and everything outside ``encoder.``,
  ``quantizer.``, ``decoder.`` (e.g. a GAN checkpoint's discriminator) are dropped;
- every float tensor is stored in the requested type (``f16``: all of them, biases, Snake
  alphas and codebooks included, as the published files do; ``f32``: all F32).

Tensors are written in torch shape order; the file's ``ne`` is that shape reversed.
torch is imported lazily, so importing this module needs only numpy and gguf.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

from . import layout as layout
from .gguf_write import MetaValue, TensorData, copy_field, copy_tensor, field_value, write_gguf
from ..errors import ModelFileError, TensorError
from ..progress import ProgressCallback

CODEC_ARCH = "fish-speech-codec"
MERGED_ARCH = "fish-speech"
MERGED_PREFIX = "c."
CODEC_ROOTS = ("encoder.", "quantizer.", "decoder.")
BUFFER_SUFFIXES = ("freqs_cis", "causal_mask", "k_cache", "v_cache")
DTYPES = {"f16": np.float16, "f32": np.float32}
WN_PARAM = (".parametrizations.weight.original0", ".parametrizations.weight.original1")
WN_LEGACY = (".weight_g", ".weight_v")


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "converting a PyTorch checkpoint needs torch: pip install pyggml_codec[convert]"
        ) from exc
    return torch


# --------------------------------------------------------------------------- checkpoint


def load_state_dict(src: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """The codec tensors of ``src`` (a path to a .pth, or a state dict), without prefixes.

    Accepts a plain state dict or one under ``"state_dict"``; keys may start with
    ``generator.``. Keys outside the codec and buffers are dropped.
    """
    if isinstance(src, (str, Path)):
        path = Path(src)
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        src = _torch().load(path, map_location="cpu", weights_only=True)
    if not isinstance(src, Mapping):
        raise ModelFileError(f"checkpoint is a {type(src).__name__}, not a state dict")
    if "state_dict" in src and isinstance(src["state_dict"], Mapping):
        src = src["state_dict"]
    out = {}
    for key, value in src.items():
        key = key.removeprefix("generator.")
        if key.startswith(CODEC_ROOTS) and not key.endswith(BUFFER_SUFFIXES):
            out[key] = value
    if not out:
        raise ModelFileError(
            "checkpoint holds no codec tensors (encoder.*, quantizer.*, decoder.*)"
        )
    return out


def _weight_norm_pair(key: str) -> tuple[str, int] | None:
    """(folded name, 0 for g / 1 for v) when ``key`` is half of a weight-norm pair."""
    for suffixes in (WN_PARAM, WN_LEGACY):
        for which, suffix in enumerate(suffixes):
            if key.endswith(suffix):
                return key[: -len(suffix)] + ".weight", which
    return None


def fold_weight_norm(state: Mapping[str, Any]) -> dict[str, Any]:
    """State dict with every (g, v) pair replaced by ``name.weight`` = g * v / ||v|| (float32)."""
    torch = _torch()
    plain, pairs = {}, {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise TensorError(f"{key!r} is not a float tensor ({type(value).__name__})")
        pair = _weight_norm_pair(key)
        if pair is None:
            plain[key] = value.float()
        else:
            pairs.setdefault(pair[0], [None, None])[pair[1]] = value.float()
    for name, (g, v) in pairs.items():
        if g is None or v is None:
            raise TensorError(f"weight norm of {name!r} has only one of its g / v tensors")
        if name in plain:
            raise TensorError(f"{name!r} is stored both plain and weight-normed")
        plain[name] = torch._weight_norm(v, g, 0)  # same op torch's weight_norm runs
    return plain


def _check_names(names: Sequence[str], meta: Mapping[str, Any]) -> list[str]:
    expected = layout.expected_tensor_names(meta)
    missing = [n for n in expected if n not in names]
    unexpected = sorted(set(names) - set(expected))
    if missing or unexpected:
        raise TensorError(
            f"checkpoint does not match the codec layout: missing {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
            f"{' ...' if len(unexpected) > 8 else ''}"
        )
    return expected


def _meta_values(meta: Mapping[str, Any]) -> list[MetaValue]:
    return [MetaValue(*entry) for entry in layout.metadata_entries(meta)]


def convert_checkpoint(
    src: str | Path | Mapping[str, Any],
    out_path: str | Path,
    dtype: str = "f16",
    config: Mapping[str, Any] | None = None,
    progress: ProgressCallback | None = None,
) -> Path:
    """Write a ``fish-speech-codec`` GGUF from an upstream codec checkpoint; returns its path.

    ``config`` maps metadata keys (with or without ``fish_speech.codec.``) to values; it can
    set what the tensors cannot tell (``rvq_transformer.window_size``, head dims, ...).
    ``progress`` gets "convert" reports in bytes written.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    folded = fold_weight_norm(load_state_dict(src))
    shapes = {k: tuple(v.shape) for k, v in folded.items()}
    meta = layout.infer_metadata(shapes, config)
    names = _check_names(list(folded), meta)
    tensors = (TensorData(n, folded[n].numpy().astype(DTYPES[dtype])) for n in names)
    return write_gguf(Path(out_path), CODEC_ARCH, _meta_values(meta), tensors, progress=progress, task="convert")


# --------------------------------------------------------------------------- merged files


def _open(path: str | Path, arch: str) -> GGUFReader:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    reader = GGUFReader(str(path))
    found = field_value(reader, "general.architecture")
    if arch == MERGED_ARCH and found == CODEC_ARCH:
        raise ModelFileError(f"{path}: already codec-only (architecture {CODEC_ARCH!r}); "
                             "load it as it is, there is nothing to extract")
    if found != arch:
        raise ModelFileError(f"{path}: general.architecture is {found!r}, expected {arch!r}")
    return reader


def _codec_fields(reader: GGUFReader) -> list[MetaValue]:
    return [copy_field(reader, k) for k in reader.fields if k.startswith(layout.PREFIX)]


def extract_codec(merged_path: str | Path, out_path: str | Path, progress: ProgressCallback | None = None) -> Path:
    """Write the codec of a merged ``fish-speech`` GGUF as a codec-only file (bytes unchanged).

    Codec tensors are those named ``c.*`` (prefix stripped; ``freqs_cis`` buffers dropped);
    ``fish_speech.codec.*`` metadata is copied with its types; everything else is ignored.
    A codec-only source is a ModelFileError saying so. ``progress`` gets "convert" reports in
    bytes written.
    """
    reader = _open(merged_path, MERGED_ARCH)
    tensors = [
        copy_tensor(t, t.name.removeprefix(MERGED_PREFIX))
        for t in reader.tensors
        if t.name.startswith(MERGED_PREFIX) and not t.name.endswith(BUFFER_SUFFIXES)
    ]
    if not tensors:
        raise ModelFileError(
            f"{merged_path}: no codec tensors (names starting with {MERGED_PREFIX!r})"
        )
    return write_gguf(Path(out_path), CODEC_ARCH, _codec_fields(reader), tensors, progress=progress, task="convert")


def _default_extras(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "token_embd.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "blk.0.attn_norm.weight": np.ones(8, dtype=np.float16),
        "c.quantizer.pre_module.freqs_cis": rng.standard_normal((4, 2, 2)).astype(np.float32),
    }


def write_merged_fixture(
    codec_gguf: str | Path,
    out_path: str | Path,
    extra_tensors: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """A merged ``fish-speech`` GGUF for tests: the codec tensors under ``c.`` plus non-codec
    tensors (default: ``token_embd.weight``, ``blk.0.attn_norm.weight`` and a stray
    ``c.quantizer.pre_module.freqs_cis`` buffer) and non-codec metadata."""
    reader = _open(codec_gguf, CODEC_ARCH)
    meta = [
        MetaValue("general.name", "pyggml_codec merged fixture", GGUFValueType.STRING),
        MetaValue("fish-speech.context_length", 32, GGUFValueType.UINT32),
        MetaValue("fish-speech.block_count", 1, GGUFValueType.UINT32),
        *_codec_fields(reader),
    ]
    extras = _default_extras() if extra_tensors is None else extra_tensors
    tensors = [copy_tensor(t, MERGED_PREFIX + t.name) for t in reader.tensors]
    tensors += [TensorData(name, np.asarray(data)) for name, data in extras.items()]
    return write_gguf(Path(out_path), MERGED_ARCH, meta, tensors)


# --------------------------------------------------------------------------- command line


def add_convert_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``convert`` options: SRC OUT [--dtype] [--config] [--extract]."""
    parser.add_argument(
        "src", type=Path, help="upstream codec .pth, or a merged GGUF with --extract"
    )
    parser.add_argument("out", type=Path, help="output codec GGUF")
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default="f16", help="tensor type (default f16)"
    )
    parser.add_argument(
        "--config", default=None,
        help="metadata overrides: a JSON object or a path to a JSON file, "
        'e.g. \'{"rvq_transformer.window_size": 128}\'',
    )
    parser.add_argument(
        "--extract", action="store_true",
        help="SRC is a merged fish-speech GGUF: copy its codec part unchanged (ignores --dtype)",
    )
    return parser


def parse_config(text: str | None) -> dict[str, Any] | None:
    """``--config`` value: inline JSON object or a path to a JSON file."""
    if text is None:
        return None
    path = Path(text)
    raw = path.read_text() if not text.lstrip().startswith("{") and path.is_file() else text
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config is neither a JSON object nor a JSON file: {text!r}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"--config must be a JSON object, got {type(value).__name__}")
    return value


def run_convert(args: argparse.Namespace, progress: ProgressCallback | None = None) -> Path:
    """Run the conversion the parsed arguments ask for; returns the written path."""
    if not args.src.exists():
        raise FileNotFoundError(f"source not found: {args.src}")
    if args.extract:
        if args.config is not None:
            raise ValueError("--config cannot be combined with --extract")
        return extract_codec(args.src, args.out, progress)
    config = parse_config(args.config)
    return convert_checkpoint(args.src, args.out, dtype=args.dtype, config=config, progress=progress)


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_convert_arguments(argparse.ArgumentParser(prog="python -m pyggml_codec.model.convert"))
    args = parser.parse_args(argv)
    try:
        out = run_convert(args)
    except (OSError, ValueError, ImportError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
