"""The tensor-name table and strict loading.

Every tensor the configuration implies is listed here once, with its PyTorch shape and
its role; loading checks presence, shape and type of each and refuses unexpected codec
tensors. Roles decide how a tensor is held on the backend:

* ``conv``   conv weights: F32 in "f32" mode, F16 in "s2cpp" mode (as ggml_conv_1d needs);
* ``conv_mm`` the decoder's stem conv, whose product takes the weights as its first operand
  (im2col columns, one GEMM): as ``conv``, or F16 from an F16 file where the plan's ``matrices``
  is "stored" (the product then reads it through the row-product kernel);
* ``conv_ru`` the residual units' dilated convs: as ``conv``, except where the plan runs them
  by BLAS GEMMs (``Plan.ru_weights``): per tap, F32 re-laid to ne [Cin, Cout, K], a matrix per tap;
  or Winograd F(4,7), the 10 transformed matrices ne [Cin, Cout, 10] (winograd.WINOGRAD);
* ``linear`` transformer / ConvNeXt matrices: as stored where the plan's ``matrices`` is "stored"
  ("s2cpp", and "f32" on the CPU, whose row-product kernel upcasts F16 exactly), else F32; the only
  role a quantized type (Q8_0, Q6_K, Q5_K, Q4_K; ``pyggml-codec quantize``) may take, and then it is
  held as stored in both modes (ggml's quantized products);
* ``convT``  conv-transpose weights, re-laid to ne [Cin, K, Cout] for one GEMM: F32, or F16 from an
  F16 file in "f32" precision where the plan's ``matrices`` is "stored";
* ``dwconv`` the ConvNeXt depthwise kernels: F32 in "f32" mode, F16 in "s2cpp" mode (the C++
  engine's ``ggml_conv_1d_dw`` takes F16 columns against them);
* ``vq_out`` the VQ out_proj matrices: F32 in "f32" mode, as stored in "s2cpp" (the C++
  engine's product is against the file's tensor: F16 x F16 in an F16 file);
* ``f32``    vectors and codebooks: F32;
* ``host``   VQ in_proj: numpy only (the encode VQ runs on the host).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend.binding import QUANT_TYPES
from ..backend.winograd_tables import WINOGRAD
from ..errors import TensorError
from ..plan import Plan
from .config import RESIDUAL_DILATIONS, CodecConfig, TransformerConfig
from .gguf_file import FLOAT_TYPES, ModelFile
from .vq import stage_prefixes

PARTS = ("all", "encode", "decode")
ENC, DEC = frozenset({"encode"}), frozenset({"decode"})
BOTH = ENC | DEC
# Kernel sizes fixed in upstream code (not stated in the file).
STEM_K, RU_K, ENC_HEAD_K, DEC_HEAD_K, DW_K, CONVNEXT_RATIO = 7, 7, 3, 7, 7, 4
IGNORED_SUFFIXES = ("freqs_cis", "causal_mask")

LAYER_TENSORS = (  # the tensors of one transformer layer, under "<prefix>.layers.<i>."
    "attention.wqkv.weight",
    "attention.wo.weight",
    "feed_forward.w1.weight",
    "feed_forward.w2.weight",
    "feed_forward.w3.weight",
    "attention_norm.weight",
    "ffn_norm.weight",
    "attention_layer_scale.gamma",
    "ffn_layer_scale.gamma",
)



@dataclass(frozen=True)
class TensorSpec:
    name: str  # without the file's prefix
    shape: tuple[int, ...]  # PyTorch order
    role: str
    parts: frozenset


def _conv(specs: list, p: str, cout: int, cin: int, k: int, parts, role: str = "conv") -> None:
    specs.append(TensorSpec(f"{p}.weight", (cin, cout, k) if role == "convT" else (cout, cin, k), role, parts))
    specs.append(TensorSpec(f"{p}.bias", (cout,), "f32", parts))


def _vec(specs: list, name: str, shape: tuple, parts) -> None:
    specs.append(TensorSpec(name, shape, "f32", parts))


def _residual_units(specs: list, p: str, first: int, c: int, parts) -> None:
    for j in range(len(RESIDUAL_DILATIONS)):
        q = f"{p}.block.{first + j}.block"
        _vec(specs, f"{q}.0.alpha", (1, c, 1), parts)
        _conv(specs, f"{q}.1.conv", c, c, RU_K, parts, role="conv_ru")
        _vec(specs, f"{q}.2.alpha", (1, c, 1), parts)
        _conv(specs, f"{q}.3.conv", c, c, 1, parts)


def _transformer(specs: list, p: str, tc: TransformerConfig, n_layer: int, ffn: int, parts) -> None:
    qkv = (tc.n_head + 2 * tc.n_kv_head) * tc.head_dim
    shapes = {
        "attention.wqkv.weight": (qkv, tc.dim), "attention.wo.weight": (tc.dim, tc.n_head * tc.head_dim),
        "feed_forward.w1.weight": (ffn, tc.dim), "feed_forward.w2.weight": (tc.dim, ffn),
        "feed_forward.w3.weight": (ffn, tc.dim),
    }
    for i in range(n_layer):
        for name in LAYER_TENSORS:
            shape = shapes.get(name, (tc.dim,))
            specs.append(TensorSpec(f"{p}.layers.{i}.{name}", shape, "linear" if name in shapes else "f32", parts))
    _vec(specs, f"{p}.norm.weight", (tc.dim,), parts)


def _convnext(specs: list, p: str, d: int, parts) -> None:
    specs.append(TensorSpec(f"{p}.dwconv.conv.weight", (d, 1, DW_K), "dwconv", parts))
    _vec(specs, f"{p}.dwconv.conv.bias", (d,), parts)
    _vec(specs, f"{p}.norm.weight", (d,), parts)
    _vec(specs, f"{p}.norm.bias", (d,), parts)
    h = CONVNEXT_RATIO * d
    specs.append(TensorSpec(f"{p}.pwconv1.weight", (h, d), "linear", parts))
    _vec(specs, f"{p}.pwconv1.bias", (h,), parts)
    specs.append(TensorSpec(f"{p}.pwconv2.weight", (d, h), "linear", parts))
    _vec(specs, f"{p}.pwconv2.bias", (d,), parts)
    _vec(specs, f"{p}.gamma", (d,), parts)


def _encoder(specs: list, cfg: CodecConfig, ffn) -> None:
    ch, n = cfg.encoder.channels, len(cfg.encoder.rates)
    _conv(specs, "encoder.block.0.conv", ch[0], 1, STEM_K, ENC)
    for i, rate in enumerate(cfg.encoder.rates):
        p, half = f"encoder.block.{i + 1}", ch[i]
        _residual_units(specs, p, 0, half, ENC)
        _vec(specs, f"{p}.block.3.alpha", (1, half, 1), ENC)
        _conv(specs, f"{p}.block.4.conv", ch[i + 1], half, 2 * rate, ENC)
        layers = cfg.encoder.transformer_layers[i]
        if layers:
            _transformer(specs, f"{p}.block.5", cfg.encoder_transformer, layers, ffn(f"{p}.block.5"), ENC)
    _vec(specs, f"encoder.block.{n + 1}.alpha", (1, ch[-1], 1), ENC)
    _conv(specs, f"encoder.block.{n + 2}.conv", ch[-1], ch[-1], ENC_HEAD_K, ENC)


def _quantizer(specs: list, cfg: CodecConfig, ffn) -> None:
    q, d = cfg.quantizer, cfg.quantizer.input_dim
    for i, f in enumerate(q.downsample):
        _conv(specs, f"quantizer.downsample.{i}.0.conv", d, d, f, ENC)
        _convnext(specs, f"quantizer.downsample.{i}.1", d, ENC)
    for i, f in enumerate(reversed(q.downsample)):
        _conv(specs, f"quantizer.upsample.{i}.0.conv", d, d, f, DEC, role="convT")
        _convnext(specs, f"quantizer.upsample.{i}.1", d, DEC)
    rvq = cfg.rvq_transformer
    _transformer(specs, "quantizer.pre_module", rvq, rvq.n_layer, ffn("quantizer.pre_module"), ENC)
    _transformer(specs, "quantizer.post_module", rvq, rvq.n_layer, ffn("quantizer.post_module"), DEC)
    for p, size in zip(stage_prefixes(q.n_residual), q.codebook_sizes):
        specs.append(TensorSpec(f"{p}.in_proj.weight", (q.codebook_dim, d, 1), "host", ENC))
        specs.append(TensorSpec(f"{p}.in_proj.bias", (q.codebook_dim,), "host", ENC))
        specs.append(TensorSpec(f"{p}.out_proj.weight", (d, q.codebook_dim, 1), "vq_out", BOTH))
        _vec(specs, f"{p}.out_proj.bias", (d,), BOTH)
        _vec(specs, f"{p}.codebook.weight", (size, q.codebook_dim), BOTH)


def _decoder(specs: list, cfg: CodecConfig) -> None:
    ch, n = cfg.decoder.channels, len(cfg.decoder.rates)
    _conv(specs, "decoder.model.0.conv", ch[0], cfg.quantizer.input_dim, STEM_K, DEC, role="conv_mm")
    for i, rate in enumerate(cfg.decoder.rates):
        p = f"decoder.model.{i + 1}"
        _vec(specs, f"{p}.block.0.alpha", (1, ch[i], 1), DEC)
        _conv(specs, f"{p}.block.1.conv", ch[i + 1], ch[i], 2 * rate, DEC, role="convT")
        _residual_units(specs, p, 2, ch[i + 1], DEC)
    _vec(specs, f"decoder.model.{n + 1}.alpha", (1, ch[-1], 1), DEC)
    _conv(specs, f"decoder.model.{n + 2}.conv", 1, ch[-1], DEC_HEAD_K, DEC)


def expected_tensors(cfg: CodecConfig, ffn_dim=lambda prefix: None) -> list[TensorSpec]:
    """Every tensor ``cfg`` implies. ``ffn_dim(prefix)`` gives a transformer's FFN width
    (not stated in the metadata; read from the file's w1), defaulting to 3 * dim."""

    def ffn(prefix: str) -> int:
        width = ffn_dim(prefix)
        return width if width else 3 * (cfg.encoder_transformer.dim if prefix.startswith("encoder") else cfg.rvq_transformer.dim)

    specs: list[TensorSpec] = []
    _encoder(specs, cfg, ffn)
    _quantizer(specs, cfg, ffn)
    _decoder(specs, cfg)
    return specs


# --------------------------------------------------------------------------- checking


def _strip_leading_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def _shape_matches(file_shape: tuple[int, ...], spec: TensorSpec) -> bool:
    if file_shape == spec.shape:
        return True
    # VQ out_proj may be stored 4-D with a leading 1.
    return spec.name.endswith("out_proj.weight") and _strip_leading_ones(file_shape) == spec.shape


def check_tensors(mf: ModelFile, specs: list[TensorSpec], prefix: str) -> None:
    """Raise TensorError for the first missing, mis-shaped, mistyped or unexpected tensor."""
    wanted = {prefix + s.name for s in specs}
    for s in specs:
        info = mf.tensors.get(prefix + s.name)
        if info is None:
            raise TensorError(f"{mf.source}: missing tensor {prefix + s.name} (expected shape {list(s.shape)})")
        if info.ggml_type in QUANT_TYPES and s.role != "linear":
            raise TensorError(f"{mf.source}: tensor {info.name} is {info.type_name}; quantized types are accepted "
                              f"for the transformer and ConvNeXt matrices only, this one must be F32 or F16")
        if info.ggml_type not in FLOAT_TYPES and info.ggml_type not in QUANT_TYPES:
            raise TensorError(f"{mf.source}: tensor {info.name} has unsupported {info.type_name}; F32 or F16 expected "
                              f"(or, for matrices, one of {', '.join(QUANT_TYPES.values())})")
        if not _shape_matches(info.shape, s):
            raise TensorError(
                f"{mf.source}: tensor {info.name} has shape {list(info.shape)}, expected {list(s.shape)}"
            )
    for name in mf.tensors:
        if name.startswith(prefix) and name not in wanted and not name.endswith(IGNORED_SUFFIXES):
            raise TensorError(f"{mf.source}: unexpected codec tensor {name} (not implied by the metadata)")


def host_array(mf: ModelFile, prefix: str, spec: TensorSpec) -> np.ndarray:
    """The tensor's data as float32 numpy in PyTorch shape."""
    info = mf.tensors[prefix + spec.name]
    return np.asarray(info.data).reshape(spec.shape).astype(np.float32)


def backend_array(mf: ModelFile, prefix: str, spec: TensorSpec, plan: Plan) -> np.ndarray:
    """The tensor as it is held on the backend (dtype and layout per role), numpy order."""
    info = mf.tensors[prefix + spec.name]
    if info.ggml_type in QUANT_TYPES:  # raw blocks, uploaded as stored (check_tensors: matrices only)
        return np.asarray(info.data)
    data = np.asarray(info.data).reshape(spec.shape)
    if spec.role == "convT" and plan.conv_transpose == "col2im":  # (Cin, Cout, K) -> (Cout, K, Cin): ne [Cin, K, Cout]
        dtype = np.float16 if _stored_f16(spec, info.ggml_type, plan) else np.float32
        return np.ascontiguousarray(data.astype(dtype).transpose(1, 2, 0))
    layout = plan.ru_weights if spec.role == "conv_ru" else "conv"
    if layout != "conv":  # (Cout, Cin, K) -> (K, Cout, Cin) [-> (n, Cout, Cin)]
        taps = np.ascontiguousarray(data.astype(np.float32).transpose(2, 0, 1))
        return WINOGRAD.weights(taps) if layout == "winograd" else taps
    if spec.role in ("conv", "conv_ru", "dwconv", "conv_mm"):
        return data.astype(np.float16 if plan.reproduces_s2cpp or _stored_f16(spec, info.ggml_type, plan)
                           else np.float32)
    if spec.role == "vq_out":
        return data if plan.reproduces_s2cpp else data.astype(np.float32)
    if spec.role == "linear":
        return data if plan.matrices == "stored" else data.astype(np.float32)
    return data.astype(np.float32)


def _stored_f16(spec: TensorSpec, file_type: int, plan: Plan) -> bool:
    """Whether the F16 file tensor is held as F16 (see the roles above and plan "matrices")."""
    if file_type != 1:
        return False
    if spec.role in ("conv", "conv_ru", "dwconv"):
        return plan.reproduces_s2cpp
    if spec.role == "conv_mm":
        return plan.reproduces_s2cpp or plan.matrices == "stored"
    if spec.role == "vq_out":
        return plan.reproduces_s2cpp
    if spec.role == "linear":
        return plan.matrices == "stored"
    if spec.role == "convT":  # the C++ engine's conv-transposes are F32: only "f32" precision holds them F16
        return not plan.reproduces_s2cpp and plan.matrices == "stored" and plan.conv_transpose == "col2im"
    return False


def backend_layout(spec: TensorSpec, file_type: int, plan: Plan) -> tuple[int, tuple[int, ...]]:
    """(ggml type, numpy shape) of the tensor as ``backend_array`` makes it, without reading data."""
    if file_type in QUANT_TYPES:
        return file_type, spec.shape
    if spec.role == "convT" and plan.conv_transpose == "col2im":
        cin, cout, k = spec.shape
        return (1 if _stored_f16(spec, file_type, plan) else 0), (cout, k, cin)
    layout = plan.ru_weights if spec.role == "conv_ru" else "conv"
    if layout != "conv":
        cout, cin, k = spec.shape
        return 0, ((WINOGRAD.n if layout == "winograd" else k), cout, cin)
    f16 = (spec.role in ("conv", "conv_ru", "dwconv", "conv_mm") and plan.reproduces_s2cpp) or \
        _stored_f16(spec, file_type, plan)
    return (1 if f16 else 0), spec.shape


def ffn_width_reader(mf: ModelFile, prefix: str):
    def ffn(p: str) -> int | None:
        info = mf.tensors.get(f"{prefix}{p}.layers.0.feed_forward.w1.weight")
        return info.shape[0] if info is not None and len(info.shape) == 2 else None

    return ffn
