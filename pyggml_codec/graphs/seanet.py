"""The convolutional stacks: encoder (wave -> latent) and decoder (latent -> wave).

Block names follow the upstream modules (DAC's ResidualUnit, EncoderBlock, DecoderBlock)
and the tensor names of the checkpoint. Layouts (see ops.py): the stacks run in CF;
a conv-transpose reads CL, so each decoder block starts with one transpose.
"""

from __future__ import annotations

from . import convs, ops
from ..model.config import RESIDUAL_DILATIONS, CodecConfig
from .ops import Builder, Tensor
from .transformer import transformer

def residual_unit(g: Builder, x: Tensor, w, p: str, dilation: int) -> Tensor:
    """Snake -> conv k7 (dilated) -> Snake -> conv k1, plus the input. CF in and out."""
    h = ops.snake(g, x, w[f"{p}.block.0.alpha"], "CF")
    h = convs.residual_conv(g, h, w[f"{p}.block.1.conv.weight"], dilation)
    # bias + Snake (+ the cast to F16 in "s2cpp"), then bias + residual: fused on the CPU, each
    # over the conv output it reads (no other op reads it).
    if g.conv in ("taps", "winograd"):  # CF throughout: BLAS GEMMs over the signal in place
        h = ops.bias_snake(g, h, w[f"{p}.block.1.conv.bias"], w[f"{p}.block.2.alpha"], "CF", ops.F32, last_use=True)
        h = convs.pointwise_taps(g, h, w[f"{p}.block.3.conv.weight"])
        return ops.add_bias_residual(g, h, w[f"{p}.block.3.conv.bias"], x, "CF", last_use=True)
    h = ops.bias_snake(g, h, w[f"{p}.block.1.conv.bias"], w[f"{p}.block.2.alpha"], "CL",
                       ops.F16 if g.f16_convs else ops.F32, last_use=True)
    h = convs.conv1x1(g, h, w[f"{p}.block.3.conv.weight"], None, out="CF")
    return ops.add_bias_residual(g, h, w[f"{p}.block.3.conv.bias"], x, "CF", last_use=True)


def encoder_block(g: Builder, x: Tensor, w, cfg: CodecConfig, index: int) -> Tensor:
    """Residual units at C/2 -> Snake -> strided conv to C [-> transformer]. CF in and out."""
    p = f"encoder.block.{index + 1}"
    rate = cfg.encoder.rates[index]
    n_layers = cfg.encoder.transformer_layers[index]
    for j, d in enumerate(RESIDUAL_DILATIONS):
        x = residual_unit(g, x, w, f"{p}.block.{j}", d)
    x = ops.snake(g, x, w[f"{p}.block.3.alpha"], "CF", last_use=True)
    out = "CL" if n_layers else "CF"
    x = convs.conv1d(g, x, w[f"{p}.block.4.conv.weight"], w[f"{p}.block.4.conv.bias"], stride=rate, out=out)
    if n_layers:
        x = transformer(g, x, w, f"{p}.block.5", cfg.encoder_transformer, n_layers)
        x = ops.transpose(g, x)
    return x


def encoder(g: Builder, audio: Tensor, w, cfg: CodecConfig) -> Tensor:
    """Wave CF ``[n, 1]`` -> latent CF ``[n / hop, latent_dim]``."""
    x = convs.conv1d(g, audio, w["encoder.block.0.conv.weight"], w["encoder.block.0.conv.bias"], out="CF")
    n_blocks = len(cfg.encoder.rates)
    for i in range(n_blocks):
        x = encoder_block(g, x, w, cfg, i)
        g.mark(f"enc.block{i + 1}", x)
    x = ops.snake(g, x, w[f"encoder.block.{n_blocks + 1}.alpha"], "CF", last_use=True)
    head = f"encoder.block.{n_blocks + 2}.conv"
    return convs.conv1d(g, x, w[f"{head}.weight"], w[f"{head}.bias"], out="CF")


def decoder_block(g: Builder, x: Tensor, w, cfg: CodecConfig, index: int) -> Tensor:
    """Snake -> conv-transpose (stride = rate) -> residual units. CL in, CF out."""
    p = f"decoder.model.{index + 1}"
    x = ops.snake(g, x, w[f"{p}.block.0.alpha"], "CL", last_use=True)
    x = convs.conv_transpose1d(g, x, w[f"{p}.block.1.conv.weight"], w[f"{p}.block.1.conv.bias"],
                             stride=cfg.decoder.rates[index])
    for j, d in enumerate(RESIDUAL_DILATIONS):
        x = residual_unit(g, x, w, f"{p}.block.{j + 2}", d)
    return x


def decoder(g: Builder, x: Tensor, w, cfg: CodecConfig) -> Tensor:
    """Latent CF ``[T, latent_dim]`` -> wave ``[T * hop, 1]`` (after tanh)."""
    x = convs.conv1d(g, x, w["decoder.model.0.conv.weight"], w["decoder.model.0.conv.bias"], out="CL")
    n_blocks = len(cfg.decoder.rates)
    for i in range(n_blocks):
        if i:
            x = ops.transpose(g, x)  # CF -> CL for the conv-transpose
        x = decoder_block(g, x, w, cfg, i)
        g.mark(f"dec.block{i + 1}", x)
    x = ops.snake(g, x, w[f"decoder.model.{n_blocks + 1}.alpha"], "CF", last_use=True)
    head = f"decoder.model.{n_blocks + 2}.conv"
    x = convs.conv1d(g, x, w[f"{head}.weight"], w[f"{head}.bias"], out="CF")
    g.mark("dec.pre_tanh", x)
    return ops.tanh(g, x)
