"""Converter side of the codec layout: GGUF metadata keys and the checkpoint's tensor names.

Everything is inferred from tensor shapes (``dict[name, shape]`` in torch order, after weight
norm folding); only values that no tensor states have defaults (the S2 Pro values, see
S2_CODEC.md section 2). No torch, no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gguf import GGUFValueType

from ..errors import ConfigError, TensorError

PREFIX = "fish_speech.codec."
Shapes = Mapping[str, Sequence[int]]

U32, I32, F32, STR, ARR = "u32", "i32", "f32", "str", "arr"
KEY_TYPES: dict[str, str] = {
    "sample_rate": U32, "hop_length": U32, "frame_length": U32,
    "encoder_dim": U32, "encoder_rates": ARR, "encoder_transformer_layers": ARR,
    "decoder_dim": U32, "decoder_rates": ARR, "decoder_transformer_layers": ARR,
    "latent_dim": U32, "quantizer_input_dim": U32, "quantizer_codebook_dim": U32,
    "quantizer_residual_codebooks": U32, "quantizer_residual_codebook_size": U32,
    "quantizer_semantic_codebook_size": U32, "quantizer_downsample_factor": ARR,
    "quantizer_type": STR,
    "transformer.block_size": U32, "transformer.n_local_heads": I32,
    "transformer.head_dim": U32, "transformer.rope_freq_base": F32,
    "transformer.layer_norm_rms_eps": F32,
    "rvq_transformer.window_size": U32, "rvq_transformer.block_size": U32,
    "rvq_transformer.n_layer": U32, "rvq_transformer.n_head": U32,
    "rvq_transformer.feed_forward_length": U32, "rvq_transformer.n_local_heads": I32,
    "rvq_transformer.head_dim": U32, "rvq_transformer.dim": U32,
    "rvq_transformer.rope_freq_base": F32, "rvq_transformer.layer_norm_rms_eps": F32,
}
# Values no tensor shape states: the published S2 Pro values.
DEFAULTS: dict[str, Any] = {
    "sample_rate": 44100, "frame_length": 512,
    "quantizer_type": "downsample_residual_vector_quantize",
    "transformer.block_size": 8192, "transformer.head_dim": 64,
    "transformer.rope_freq_base": 10000.0, "transformer.layer_norm_rms_eps": 1e-5,
    "rvq_transformer.window_size": 128, "rvq_transformer.block_size": 2048,
    "rvq_transformer.head_dim": 64,
    "rvq_transformer.rope_freq_base": 10000.0, "rvq_transformer.layer_norm_rms_eps": 1e-5,
}
LAYER_TENSORS = (
    "attention.wqkv.weight", "attention.wo.weight", "feed_forward.w1.weight",
    "feed_forward.w2.weight", "feed_forward.w3.weight", "attention_norm.weight",
    "ffn_norm.weight", "attention_layer_scale.gamma", "ffn_layer_scale.gamma",
)
CONVNEXT_TENSORS = (
    "dwconv.conv.weight", "dwconv.conv.bias", "norm.weight", "norm.bias",
    "pwconv1.weight", "pwconv1.bias", "pwconv2.weight", "pwconv2.bias", "gamma",
)
VQ_TENSORS = (
    "in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias", "codebook.weight",
)


def _shape(shapes: Shapes, name: str) -> Sequence[int]:
    if name not in shapes:
        raise TensorError(f"checkpoint is missing tensor {name!r}")
    return shapes[name]


def _count_from(shapes: Shapes, fmt: str, start: int) -> int:
    n = 0
    while fmt.format(start + n) in shapes:
        n += 1
    return n


def _rate(shapes: Shapes, name: str) -> int:
    kernel = _shape(shapes, name)[-1]
    if kernel % 2:
        raise TensorError(f"{name}: kernel {kernel} is not 2 * rate")
    return kernel // 2


def _heads(shapes: Shapes, prefix: str, dim: int, head_dim: int) -> tuple[int, int]:
    """(n_head, n_local_heads as stored: -1 when equal to n_head) of a transformer."""
    if dim % head_dim:
        raise ConfigError(f"{prefix}: dim {dim} is not a multiple of head_dim {head_dim}")
    n_head = dim // head_dim
    rows = _shape(shapes, f"{prefix}layers.0.attention.wqkv.weight")[0]
    n_local = (rows // head_dim - n_head) // 2
    if (n_head + 2 * n_local) * head_dim != rows or n_local < 1:
        raise TensorError(f"{prefix}: wqkv has {rows} rows, not (n_head + 2 n_kv) * {head_dim}")
    return n_head, -1 if n_local == n_head else n_local


def _encoder_meta(shapes: Shapes) -> dict[str, Any]:
    n_blocks = _count_from(shapes, "encoder.block.{}.block.4.conv.weight", 1)
    if n_blocks == 0:
        raise TensorError("checkpoint has no encoder blocks (encoder.block.1.block.4.conv.weight)")
    blocks = range(1, n_blocks + 1)
    rates = [_rate(shapes, f"encoder.block.{e}.block.4.conv.weight") for e in blocks]
    layers = [
        _count_from(shapes, f"encoder.block.{e}.block.5.layers.{{}}.attention.wqkv.weight", 0)
        for e in blocks
    ]
    return {
        "encoder_dim": _shape(shapes, "encoder.block.0.conv.weight")[0],
        "encoder_rates": rates,
        "encoder_transformer_layers": layers,
        "hop_length": math.prod(rates),
        "latent_dim": _shape(shapes, f"encoder.block.{n_blocks + 2}.conv.weight")[0],
    }


def _decoder_meta(shapes: Shapes) -> dict[str, Any]:
    n_blocks = _count_from(shapes, "decoder.model.{}.block.1.conv.weight", 1)
    if n_blocks == 0:
        raise TensorError("checkpoint has no decoder blocks (decoder.model.1.block.1.conv.weight)")
    blocks = range(1, n_blocks + 1)
    rates = [_rate(shapes, f"decoder.model.{d}.block.1.conv.weight") for d in blocks]
    return {
        "decoder_dim": _shape(shapes, "decoder.model.0.conv.weight")[0],
        "decoder_rates": rates,
        # upstream builds decoder transformers but never calls them: no weights, so zeros.
        "decoder_transformer_layers": [0] * n_blocks,
    }


def _quantizer_meta(shapes: Shapes) -> dict[str, Any]:
    sem = "quantizer.semantic_quantizer.quantizers.0."
    n_down = _count_from(shapes, "quantizer.downsample.{}.0.conv.weight", 0)
    return {
        "quantizer_input_dim": _shape(shapes, sem + "in_proj.weight")[1],
        "quantizer_codebook_dim": _shape(shapes, sem + "codebook.weight")[1],
        "quantizer_semantic_codebook_size": _shape(shapes, sem + "codebook.weight")[0],
        "quantizer_residual_codebooks": _count_from(
            shapes, "quantizer.quantizer.quantizers.{}.codebook.weight", 0
        ),
        "quantizer_residual_codebook_size": _shape(
            shapes, "quantizer.quantizer.quantizers.0.codebook.weight"
        )[0],
        "quantizer_downsample_factor": [
            _shape(shapes, f"quantizer.downsample.{i}.0.conv.weight")[-1] for i in range(n_down)
        ],
    }


def _rvq_meta(shapes: Shapes, head_dim: int) -> dict[str, Any]:
    pre = "quantizer.pre_module."
    dim = _shape(shapes, pre + "norm.weight")[0]
    n_head, n_local = _heads(shapes, pre, dim, head_dim)
    return {
        "rvq_transformer.dim": dim,
        "rvq_transformer.n_layer": _count_from(shapes, pre + "layers.{}.attention.wqkv.weight", 0),
        "rvq_transformer.n_head": n_head,
        "rvq_transformer.n_local_heads": n_local,
        "rvq_transformer.feed_forward_length": _shape(
            shapes, pre + "layers.0.feed_forward.w1.weight"
        )[0],
    }


def _encoder_transformer_heads(shapes: Shapes, meta: Mapping[str, Any], head_dim: int) -> int:
    for e, n in enumerate(meta["encoder_transformer_layers"], start=1):
        if n:
            prefix = f"encoder.block.{e}.block.5."
            return _heads(shapes, prefix, _shape(shapes, prefix + "norm.weight")[0], head_dim)[1]
    return -1


def _normalize_overrides(config: Mapping[str, Any] | None) -> dict[str, Any]:
    out = {}
    for key, value in (config or {}).items():
        short = key.removeprefix(PREFIX)
        if short not in KEY_TYPES:
            raise ConfigError(f"unknown codec metadata key {key!r} in config")
        out[short] = value
    return out


def infer_metadata(shapes: Shapes, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """All `fish_speech.codec.*` values (keys without prefix) from tensor shapes + overrides.

    ``config`` may set any key; an unknown key, or a value that contradicts the tensors,
    raises ConfigError.
    """
    overrides = _normalize_overrides(config)
    meta: dict[str, Any] = dict(DEFAULTS)
    meta.update({k: v for k, v in overrides.items() if k.endswith("head_dim")})
    inferred = {
        **_encoder_meta(shapes), **_decoder_meta(shapes), **_quantizer_meta(shapes),
        **_rvq_meta(shapes, int(meta["rvq_transformer.head_dim"])),
    }
    inferred["transformer.n_local_heads"] = _encoder_transformer_heads(
        shapes, inferred, int(meta["transformer.head_dim"])
    )
    for key, value in overrides.items():
        checked = key in inferred and key != "decoder_transformer_layers"
        if checked and _norm(value) != _norm(inferred[key]):
            raise ConfigError(f"config sets {key}={value!r} but the tensors say {inferred[key]!r}")
    meta.update(inferred)
    meta.update(overrides)
    return meta


def _norm(value: Any) -> Any:
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else value


Entry = tuple[str, Any, GGUFValueType, GGUFValueType | None]


def metadata_entries(meta: Mapping[str, Any]) -> list[Entry]:
    """(full key, value, GGUF type, array element type) for every key, in KEY_TYPES order."""
    scalar = {U32: GGUFValueType.UINT32, I32: GGUFValueType.INT32,
              F32: GGUFValueType.FLOAT32, STR: GGUFValueType.STRING}
    casts = {U32: int, I32: int, F32: float, STR: str}
    entries = []
    for key, kind in KEY_TYPES.items():
        value = meta[key]
        if kind == ARR:
            ints = [int(v) for v in value]
            entries.append((PREFIX + key, ints, GGUFValueType.ARRAY, GGUFValueType.INT32))
        else:
            entries.append((PREFIX + key, casts[kind](value), scalar[kind], None))
    return entries


# --------------------------------------------------------------------------- tensor names


def _transformer_names(prefix: str, n_layer: int) -> list[str]:
    names = [f"{prefix}layers.{n}.{t}" for n in range(n_layer) for t in LAYER_TENSORS]
    return names + [f"{prefix}norm.weight"]


def _conv(prefix: str) -> list[str]:
    return [f"{prefix}.conv.weight", f"{prefix}.conv.bias"]


def _residual_unit(prefix: str) -> list[str]:
    return [f"{prefix}.block.0.alpha", *_conv(f"{prefix}.block.1"),
            f"{prefix}.block.2.alpha", *_conv(f"{prefix}.block.3")]


def _encoder_names(meta: Mapping[str, Any]) -> list[str]:
    names = _conv("encoder.block.0")
    layers = meta["encoder_transformer_layers"]
    for e in range(1, len(meta["encoder_rates"]) + 1):
        p = f"encoder.block.{e}.block"
        for u in range(3):
            names += _residual_unit(f"{p}.{u}")
        names += [f"{p}.3.alpha", *_conv(f"{p}.4")]
        if layers[e - 1]:
            names += _transformer_names(f"{p}.5.", layers[e - 1])
    head = len(meta["encoder_rates"]) + 1
    return names + [f"encoder.block.{head}.alpha", *_conv(f"encoder.block.{head + 1}")]


def _decoder_names(meta: Mapping[str, Any]) -> list[str]:
    names = _conv("decoder.model.0")
    for d in range(1, len(meta["decoder_rates"]) + 1):
        p = f"decoder.model.{d}.block"
        names += [f"{p}.0.alpha", *_conv(f"{p}.1")]
        for u in (2, 3, 4):
            names += _residual_unit(f"{p}.{u}")
    head = len(meta["decoder_rates"]) + 1
    return names + [f"decoder.model.{head}.alpha", *_conv(f"decoder.model.{head + 1}")]


def _quantizer_names(meta: Mapping[str, Any]) -> list[str]:
    names = []
    for side in ("downsample", "upsample"):
        for i in range(len(meta["quantizer_downsample_factor"])):
            names += _conv(f"quantizer.{side}.{i}.0")
            names += [f"quantizer.{side}.{i}.1.{t}" for t in CONVNEXT_TENSORS]
    n_layer = meta["rvq_transformer.n_layer"]
    names += _transformer_names("quantizer.pre_module.", n_layer)
    names += _transformer_names("quantizer.post_module.", n_layer)
    names += [f"quantizer.semantic_quantizer.quantizers.0.{t}" for t in VQ_TENSORS]
    for n in range(meta["quantizer_residual_codebooks"]):
        names += [f"quantizer.quantizer.quantizers.{n}.{t}" for t in VQ_TENSORS]
    return names


def expected_tensor_names(meta: Mapping[str, Any]) -> list[str]:
    """Every codec tensor name (S2_CODEC.md section 3, no `c.` prefix) for this metadata."""
    return _encoder_names(meta) + _quantizer_names(meta) + _decoder_names(meta)
