"""Model configuration: frozen dataclasses read from ``fish_speech.codec.*`` metadata.

Nothing about the architecture is hard-coded here except what upstream fixes in code:
the encoder transformer window (512) and the ConvNeXt LayerNorm epsilon (1e-6).
Derived values are properties, never stored twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..errors import ConfigError
from .gguf_file import MetaValue

PREFIX = "fish_speech.codec."
ENCODER_TRANSFORMER_WINDOW = 512  # fixed in upstream code, not in the file
CONVNEXT_LN_EPS = 1e-6  # fixed in upstream code, not in the file
RESIDUAL_DILATIONS = (1, 3, 9)  # of each SEANet block's residual units: fixed in upstream code

# Bounds on what the file may claim, so that no count drives a loop or an allocation
# past what a real codec needs (S2 Pro: 4 blocks, 2 factors, 8 layers, 10 VQ stages).
MAX_VALUE = 2**31 - 1  # every size and count must also fit a ggml int32 argument
MAX_STAGES = 16  # entries of a rates / factors / per-block layers array
MAX_LAYERS = 1024  # transformer layers per module, VQ stages

_INT_TYPES = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64"}
_FLOAT_TYPES = {"FLOAT32", "FLOAT64"}


class _Meta:
    """Typed access to the codec's metadata; every error names the key."""

    def __init__(self, metadata: Mapping[str, MetaValue]):
        self._m = metadata

    def _get(self, key: str) -> MetaValue:
        full = PREFIX + key
        if full not in self._m:
            raise ConfigError(f"missing metadata key {full}")
        return self._m[full]

    def has(self, key: str) -> bool:
        return PREFIX + key in self._m

    def int(self, key: str, minimum: int = 1, maximum: int = MAX_VALUE) -> int:
        meta = self._get(key)
        if meta.type_name not in _INT_TYPES or isinstance(meta.value, bool):
            raise ConfigError(f"{PREFIX}{key} is {meta.type_name}, expected an integer")
        value = int(meta.value)
        if not minimum <= value <= maximum:
            raise ConfigError(f"{PREFIX}{key} = {value} is impossible (must be in [{minimum}, {maximum}])")
        return value

    def signed(self, key: str) -> int:
        meta = self._get(key)
        if meta.type_name not in _INT_TYPES:
            raise ConfigError(f"{PREFIX}{key} is {meta.type_name}, expected an integer")
        return int(meta.value)

    def float(self, key: str) -> float:
        meta = self._get(key)
        if meta.type_name not in _FLOAT_TYPES:
            raise ConfigError(f"{PREFIX}{key} is {meta.type_name}, expected FLOAT32")
        value = float(meta.value)
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{PREFIX}{key} = {value} is impossible (must be finite and > 0)")
        return value

    def ints(self, key: str, minimum: int = 0, length: int | None = None, maximum: int = MAX_VALUE) -> tuple[int, ...]:
        meta = self._get(key)
        inner = meta.type_name[6:-1] if meta.type_name.startswith("ARRAY[") else ""
        if inner not in _INT_TYPES:
            raise ConfigError(f"{PREFIX}{key} is {meta.type_name}, expected an integer array")
        if not 1 <= len(meta.value) <= MAX_STAGES:
            raise ConfigError(f"{PREFIX}{key} has {len(meta.value)} entries (must be 1..{MAX_STAGES})")
        values = tuple(int(v) for v in meta.value)
        if any(not minimum <= v <= maximum for v in values):
            raise ConfigError(
                f"{PREFIX}{key} = {list(values)} is impossible (entries must be in [{minimum}, {maximum}])")
        if length is not None and len(values) != length:
            raise ConfigError(f"{PREFIX}{key} has {len(values)} entries, expected {length}")
        return values


@dataclass(frozen=True)
class TransformerConfig:
    """A windowed causal transformer (encoder block or RVQ pre/post module)."""

    dim: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    rope_base: float
    norm_eps: float
    window: int
    block_size: int


@dataclass(frozen=True)
class EncoderConfig:
    dim: int
    rates: tuple[int, ...]
    transformer_layers: tuple[int, ...]
    latent_dim: int

    @property
    def channels(self) -> tuple[int, ...]:
        """Output channels of the stem and of each encoder block: dim * 2**i."""
        return tuple(self.dim * 2**i for i in range(len(self.rates) + 1))


@dataclass(frozen=True)
class DecoderConfig:
    dim: int
    rates: tuple[int, ...]

    @property
    def channels(self) -> tuple[int, ...]:
        """Channels into each decoder block and out of the last: dim // 2**i."""
        return tuple(self.dim // 2**i for i in range(len(self.rates) + 1))


@dataclass(frozen=True)
class QuantizerConfig:
    input_dim: int
    codebook_dim: int
    n_residual: int
    residual_size: int
    semantic_size: int
    downsample: tuple[int, ...]

    @property
    def n_codebooks(self) -> int:
        return self.n_residual + 1

    @property
    def codebook_sizes(self) -> tuple[int, ...]:
        return (self.semantic_size,) + (self.residual_size,) * self.n_residual


@dataclass(frozen=True)
class CodecConfig:
    sample_rate: int
    hop_length: int
    frame_length: int
    encoder: EncoderConfig
    decoder: DecoderConfig
    quantizer: QuantizerConfig
    encoder_transformer: TransformerConfig
    rvq_transformer: TransformerConfig

    @property
    def n_codebooks(self) -> int:
        return self.quantizer.n_codebooks

    @property
    def samples_per_frame(self) -> int:
        return self.hop_length * math.prod(self.quantizer.downsample)

    @property
    def streaming_history_frames(self) -> int:
        """The C++ engine's streaming context: round_up_to_8(window - 1 + 16), 160 if <= 0."""
        frames = (max(0, self.rvq_transformer.window - 1) + 16 + 7) // 8 * 8
        return frames if frames > 0 else 160

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, MetaValue]) -> "CodecConfig":
        m = _Meta(metadata)
        encoder = EncoderConfig(
            dim=m.int("encoder_dim"),
            rates=m.ints("encoder_rates", minimum=1),
            transformer_layers=m.ints("encoder_transformer_layers", maximum=MAX_LAYERS),
            latent_dim=m.int("latent_dim"),
        )
        config = cls(
            sample_rate=m.int("sample_rate"),
            hop_length=m.int("hop_length"),
            frame_length=m.int("frame_length") if m.has("frame_length") else 512,
            encoder=encoder,
            decoder=DecoderConfig(dim=m.int("decoder_dim"), rates=m.ints("decoder_rates", minimum=1)),
            quantizer=_quantizer(m),
            encoder_transformer=_encoder_transformer(m, encoder),
            rvq_transformer=_rvq_transformer(m),
        )
        config.validate()
        return config

    def validate(self) -> None:
        """Cross-key consistency; each failure names the keys involved."""
        enc, dec, q = self.encoder, self.decoder, self.quantizer
        if len(enc.transformer_layers) != len(enc.rates):
            raise ConfigError(
                f"{PREFIX}encoder_transformer_layers has {len(enc.transformer_layers)} entries "
                f"but {PREFIX}encoder_rates has {len(enc.rates)}"
            )
        if self.frame_length % self.hop_length or self.samples_per_frame % self.frame_length:
            raise ConfigError(
                f"{PREFIX}frame_length = {self.frame_length} must be a multiple of hop_length = {self.hop_length} "
                f"that divides the code frame ({self.samples_per_frame} samples)"
            )
        if any(enc.transformer_layers[:-1]):  # its TransformerConfig has the last block's width
            raise ConfigError(
                f"{PREFIX}encoder_transformer_layers = {list(enc.transformer_layers)}: only the last encoder "
                "block may have transformer layers"
            )
        if math.prod(enc.rates) != self.hop_length:
            raise ConfigError(f"{PREFIX}hop_length = {self.hop_length} is not the product of encoder_rates {list(enc.rates)}")
        if enc.channels[-1] != enc.latent_dim:
            raise ConfigError(
                f"{PREFIX}latent_dim = {enc.latent_dim} but encoder_dim * 2**len(encoder_rates) = {enc.channels[-1]}"
            )
        if q.input_dim != enc.latent_dim:
            raise ConfigError(f"{PREFIX}quantizer_input_dim = {q.input_dim} differs from latent_dim = {enc.latent_dim}")
        if dec.dim % 2 ** len(dec.rates):
            raise ConfigError(f"{PREFIX}decoder_dim = {dec.dim} is not divisible by 2**len(decoder_rates)")
        if math.prod(dec.rates) != self.hop_length:
            raise ConfigError(f"{PREFIX}hop_length = {self.hop_length} is not the product of decoder_rates {list(dec.rates)}")
        for name, tc in (("transformer", self.encoder_transformer), ("rvq_transformer", self.rvq_transformer)):
            if tc.n_head * tc.head_dim != tc.dim:
                raise ConfigError(f"{PREFIX}{name}.head_dim = {tc.head_dim} does not divide dim {tc.dim}")
            if tc.n_head % tc.n_kv_head:
                raise ConfigError(f"{PREFIX}{name}.n_local_heads = {tc.n_kv_head} does not divide n_head {tc.n_head}")
        if self.rvq_transformer.dim != q.input_dim:
            raise ConfigError(f"{PREFIX}rvq_transformer.dim = {self.rvq_transformer.dim} differs from quantizer_input_dim")
        rvq = self.rvq_transformer
        if rvq.window > rvq.block_size:  # a stream's carried history is window frames: past its longest sequence
            raise ConfigError(f"{PREFIX}rvq_transformer.window_size = {rvq.window} exceeds its block_size = "
                              f"{rvq.block_size}")


def _quantizer(m: _Meta) -> QuantizerConfig:
    return QuantizerConfig(
        input_dim=m.int("quantizer_input_dim"),
        codebook_dim=m.int("quantizer_codebook_dim"),
        n_residual=m.int("quantizer_residual_codebooks", minimum=0, maximum=MAX_LAYERS),
        residual_size=m.int("quantizer_residual_codebook_size"),
        semantic_size=m.int("quantizer_semantic_codebook_size"),
        downsample=m.ints("quantizer_downsample_factor", minimum=1),
    )


def _heads(m: _Meta, prefix: str, dim: int) -> tuple[int, int, int]:
    head_dim = m.int(prefix + "head_dim")
    if head_dim % 2:  # ggml_rope asserts (aborts) on an odd rotation width
        raise ConfigError(f"{PREFIX}{prefix}head_dim = {head_dim} is odd; RoPE rotates pairs of dimensions")
    n_head = dim // head_dim
    if n_head < 1:
        raise ConfigError(f"{PREFIX}{prefix}head_dim = {head_dim} exceeds the transformer dim {dim}")
    if m.has(prefix + "n_head") and m.int(prefix + "n_head") != n_head:  # the heads come from dim / head_dim
        raise ConfigError(f"{PREFIX}{prefix}n_head = {m.int(prefix + 'n_head')} contradicts dim {dim} / "
                          f"head_dim {head_dim} = {n_head}")
    local = m.signed(prefix + "n_local_heads")
    return n_head, (n_head if local < 1 else local), head_dim


def _encoder_transformer(m: _Meta, encoder: EncoderConfig) -> TransformerConfig:
    dim = encoder.channels[-1]
    n_head, n_kv, head_dim = _heads(m, "transformer.", dim)
    return TransformerConfig(
        dim=dim,
        n_layer=max(encoder.transformer_layers) if encoder.transformer_layers else 0,
        n_head=n_head,
        n_kv_head=n_kv,
        head_dim=head_dim,
        rope_base=m.float("transformer.rope_freq_base"),
        norm_eps=m.float("transformer.layer_norm_rms_eps"),
        window=ENCODER_TRANSFORMER_WINDOW,
        block_size=m.int("transformer.block_size"),
    )


def _rvq_transformer(m: _Meta) -> TransformerConfig:
    dim = m.int("rvq_transformer.dim")
    n_head, n_kv, head_dim = _heads(m, "rvq_transformer.", dim)
    return TransformerConfig(
        dim=dim,
        n_layer=m.int("rvq_transformer.n_layer", maximum=MAX_LAYERS),
        n_head=n_head,
        n_kv_head=n_kv,
        head_dim=head_dim,
        rope_base=m.float("rvq_transformer.rope_freq_base"),
        norm_eps=m.float("rvq_transformer.layer_norm_rms_eps"),
        window=m.int("rvq_transformer.window_size"),
        block_size=m.int("rvq_transformer.block_size"),
    )
