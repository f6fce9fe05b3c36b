"""The quantizer's graph stages: the ConvNeXt block, the downsample stages (encode), the VQ
sum of the ten stages' ``out_proj(codebook[code])`` and the upsample stages (decode). The
host-side residual VQ (numpy) is ``model/vq.py``.
"""

from __future__ import annotations

from . import batched, convs, ops
from ..model.config import CONVNEXT_LN_EPS, CodecConfig
from ..model.vq import VQStage, l2_normalize, residual_quantize, stage_prefixes  # noqa: F401  (0.1's quantizer names)
from .ops import Builder, Tensor


def convnext(g: Builder, x: Tensor, w, p: str) -> Tensor:
    """Depthwise causal conv k7 -> LayerNorm -> Linear 4x -> GELU -> Linear -> gamma, plus input. CF in/out."""
    dwconv = batched.depthwise_conv1d if convs.batched(g) else convs.depthwise_conv1d
    y = dwconv(g, x, w[f"{p}.dwconv.conv.weight"], w[f"{p}.dwconv.conv.bias"])  # CL
    y = ops.layer_norm(g, y, w[f"{p}.norm.weight"], w[f"{p}.norm.bias"], CONVNEXT_LN_EPS)
    y = ops.gelu(g, ops.linear(g, y, w[f"{p}.pwconv1.weight"], w[f"{p}.pwconv1.bias"]))
    y = ops.linear(g, y, w[f"{p}.pwconv2.weight"], w[f"{p}.pwconv2.bias"])
    y = ops.scale_channels(g, y, w[f"{p}.gamma"])
    return ops.add(g, x, ops.transpose(g, y))


def downsample(g: Builder, x: Tensor, w, cfg: CodecConfig) -> Tensor:
    """Latent CF -> per factor: causal conv (kernel = stride = factor) + ConvNeXt. CF out."""
    for i, factor in enumerate(cfg.quantizer.downsample):
        p = f"quantizer.downsample.{i}"
        x = convs.conv1d(g, x, w[f"{p}.0.conv.weight"], w[f"{p}.0.conv.bias"], stride=factor, out="CF")
        x = convnext(g, x, w, f"{p}.1")
        g.mark(f"enc.downsample{i}", x)
    return x


def upsample(g: Builder, x: Tensor, w, cfg: CodecConfig) -> Tensor:
    """CL -> per factor, last factor first: conv-transpose + ConvNeXt. CF out."""
    for i, factor in enumerate(reversed(cfg.quantizer.downsample)):
        p = f"quantizer.upsample.{i}"
        if i:
            x = ops.transpose(g, x)
        x = convs.conv_transpose1d(g, x, w[f"{p}.0.conv.weight"], w[f"{p}.0.conv.bias"], stride=factor)
        x = convnext(g, x, w, f"{p}.1")
        g.mark(f"dec.upsample{i}", x)
    return x


def vq_sum(g: Builder, code_inputs: list[Tensor], w, cfg: CodecConfig) -> Tensor:
    """Sum over stages of out_proj(codebook[code]): I32 [T] per stage -> CL [input_dim, T]."""
    total = None
    for p, ids in zip(stage_prefixes(cfg.quantizer.n_residual), code_inputs):
        z = ops.get_rows(g, w[f"{p}.codebook.weight"], ids)  # [codebook_dim, T]
        out_w = w[f"{p}.out_proj.weight"]  # ne [1, codebook_dim, input_dim]
        out_w = ops.reshape_2d(g, out_w, cfg.quantizer.codebook_dim, cfg.quantizer.input_dim)
        proj = ops.linear(g, z, out_w, w[f"{p}.out_proj.bias"])
        total = proj if total is None else ops.add(g, total, proj)
    return total
