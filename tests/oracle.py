"""The independent reference: the upstream Fish Audio codec, imported from its PyPI wheels.

Nothing here is a port. The model classes are the upstream ones (`fish-speech==0.1.0`,
`descript-audio-codec==1.0.0`), imported straight from the wheel files by ``oracle_shim``
(see the design notes on the reference, ORACLE.md); stubs never outlive the import, so the real
``soundfile`` is untouched. Wheels folder: env ``PYGGML_ORACLE_WHEELS`` (default
``<repo>/.oracle_wheels``).

Padding: upstream ``DAC.encode`` right-pads the waveform with zeros to a multiple of
``frame_length`` = hop_length * 4 = 2048 samples, then runs ``encoder`` and ``quantizer``.
The C++ port pads to a multiple of 512 instead. ``encode_padded(model, audio, 512)`` pads the
signal itself and calls the same two upstream modules that ``DAC.encode`` calls (bypassing only
its 2048 padding), so upstream sees exactly the 512-padded signal.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from oracle_shim import upstream, wheels_dir  # noqa: F401  (re-exported)

# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class OracleConfig:
    """Hyper-parameters of the upstream codec (names follow S2_CODEC.md section 2)."""

    encoder_dim: int
    encoder_rates: tuple[int, ...]
    encoder_transformer_layers: tuple[int, ...]
    decoder_dim: int
    decoder_rates: tuple[int, ...]
    quantizer_input_dim: int
    residual_codebooks: int
    residual_codebook_size: int
    semantic_codebook_size: int
    codebook_dim: int
    downsample_factor: tuple[int, ...]
    rvq_n_layer: int
    rvq_dim: int
    rvq_n_head: int
    rvq_ffn: int
    rvq_window: int
    head_dim: int = 64
    block_size: int = 8192  # encoder transformer positions: 8192 latent frames = 95 s
    rvq_block_size: int = 2048  # pre/post_module positions: 2048 code frames = 95 s
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    sample_rate: int = 44100

    @property
    def latent_dim(self) -> int:
        return self.encoder_dim * 2 ** len(self.encoder_rates)

    @property
    def hop_length(self) -> int:
        return math.prod(self.encoder_rates)

    @property
    def samples_per_code_frame(self) -> int:
        return self.hop_length * math.prod(self.downsample_factor)

    def gguf_metadata(self) -> dict[str, object]:
        """The `fish_speech.codec.*` values (without prefix) the converter must write."""
        return {
            "sample_rate": self.sample_rate,
            "hop_length": self.hop_length,
            "encoder_dim": self.encoder_dim,
            "encoder_rates": list(self.encoder_rates),
            "encoder_transformer_layers": list(self.encoder_transformer_layers),
            "decoder_dim": self.decoder_dim,
            "decoder_rates": list(self.decoder_rates),
            "latent_dim": self.latent_dim,
            "quantizer_input_dim": self.quantizer_input_dim,
            "quantizer_codebook_dim": self.codebook_dim,
            "quantizer_residual_codebooks": self.residual_codebooks,
            "quantizer_residual_codebook_size": self.residual_codebook_size,
            "quantizer_semantic_codebook_size": self.semantic_codebook_size,
            "quantizer_downsample_factor": list(self.downsample_factor),
            "transformer.head_dim": self.head_dim,
            "transformer.rope_freq_base": self.rope_base,
            "transformer.layer_norm_rms_eps": self.norm_eps,
            "rvq_transformer.window_size": self.rvq_window,
            "rvq_transformer.n_layer": self.rvq_n_layer,
            "rvq_transformer.n_head": self.rvq_n_head,
            "rvq_transformer.feed_forward_length": self.rvq_ffn,
            "rvq_transformer.dim": self.rvq_dim,
            "rvq_transformer.head_dim": self.head_dim,
            "rvq_transformer.rope_freq_base": self.rope_base,
            "rvq_transformer.layer_norm_rms_eps": self.norm_eps,
        }


TINY = OracleConfig(
    encoder_dim=4, encoder_rates=(2, 4, 8, 8), encoder_transformer_layers=(0, 0, 0, 1),
    decoder_dim=64, decoder_rates=(8, 8, 4, 2), quantizer_input_dim=64,
    residual_codebooks=9, residual_codebook_size=32, semantic_codebook_size=64, codebook_dim=8,
    downsample_factor=(2, 2), rvq_n_layer=2, rvq_dim=64, rvq_n_head=1, rvq_ffn=192, rvq_window=8,
)
FULL = OracleConfig(
    encoder_dim=64, encoder_rates=(2, 4, 8, 8), encoder_transformer_layers=(0, 0, 0, 4),
    decoder_dim=1536, decoder_rates=(8, 8, 4, 2), quantizer_input_dim=1024,
    residual_codebooks=9, residual_codebook_size=1024, semantic_codebook_size=4096,
    codebook_dim=8, downsample_factor=(2, 2), rvq_n_layer=8, rvq_dim=1024, rvq_n_head=16,
    rvq_ffn=3072, rvq_window=128,
)


# --------------------------------------------------------------------------- building


def _rvq_transformer(cfg: OracleConfig) -> torch.nn.Module:
    md = upstream().modded_dac
    args = md.ModelArgs(
        block_size=cfg.rvq_block_size, n_layer=cfg.rvq_n_layer, n_head=cfg.rvq_n_head,
        dim=cfg.rvq_dim, intermediate_size=cfg.rvq_ffn, n_local_heads=-1,
        head_dim=cfg.head_dim, rope_base=cfg.rope_base, norm_eps=cfg.norm_eps,
        dropout_rate=0.1, attn_dropout_rate=0.1, channels_first=True,
    )
    return md.WindowLimitedTransformer(
        causal=True, window_size=cfg.rvq_window, input_dim=cfg.quantizer_input_dim, config=args
    )


def _construct(cfg: OracleConfig) -> torch.nn.Module:
    up = upstream()
    general = functools.partial(
        up.modded_dac.ModelArgs, block_size=cfg.block_size, n_local_heads=-1,
        head_dim=cfg.head_dim, rope_base=cfg.rope_base, norm_eps=cfg.norm_eps,
        dropout_rate=0.1, attn_dropout_rate=0.1, channels_first=True,
    )
    with warnings.catch_warnings():  # dac's WNConv1d uses the deprecated torch weight_norm
        warnings.simplefilter("ignore", FutureWarning)
        return _construct_dac(cfg, up, general)


def _construct_dac(cfg: OracleConfig, up, general) -> torch.nn.Module:
    quantizer = up.rvq.DownsampleResidualVectorQuantize(
        input_dim=cfg.quantizer_input_dim, n_codebooks=cfg.residual_codebooks,
        codebook_size=cfg.residual_codebook_size, codebook_dim=cfg.codebook_dim,
        quantizer_dropout=0.5, downsample_factor=cfg.downsample_factor,
        semantic_codebook_size=cfg.semantic_codebook_size,
        pre_module=_rvq_transformer(cfg), post_module=_rvq_transformer(cfg),
    )
    return up.modded_dac.DAC(
        encoder_dim=cfg.encoder_dim, encoder_rates=list(cfg.encoder_rates),
        decoder_dim=cfg.decoder_dim, decoder_rates=list(cfg.decoder_rates),
        quantizer=quantizer, sample_rate=cfg.sample_rate, causal=True,
        encoder_transformer_layers=list(cfg.encoder_transformer_layers),
        decoder_transformer_layers=[0, 0, 0, 0], transformer_general_config=general,
    )


def _fan_in(model: torch.nn.Module, name: str, shape: torch.Size) -> float:
    owner = model.get_submodule(name.rsplit(".", 1)[0])
    if isinstance(owner, torch.nn.ConvTranspose1d):  # weight (in, out, k): k/stride taps
        return shape[0] * shape[2] / owner.stride[0]
    return math.prod(shape[1:])


def _last_decoder_conv_g(model: torch.nn.Module) -> str:
    last = len(model.decoder.model) - 2  # [..., Snake, conv, Tanh]
    return f"decoder.model.{last}.conv.parametrizations.weight.original0"


def _draw(model, name: str, p: torch.Tensor, gen: torch.Generator, last_g: str) -> torch.Tensor:
    def uniform(lo, hi):
        return lo + (hi - lo) * torch.rand(p.shape, generator=gen)

    def normal(std):
        return std * torch.randn(p.shape, generator=gen)

    leaf = name.rsplit(".", 1)[-1]
    if name == last_g:
        return uniform(2.0, 4.0)
    if leaf == "alpha":
        return uniform(0.5, 2.0)
    if leaf == "gamma":
        return uniform(0.05, 0.3)
    if leaf in ("original0", "weight_g"):
        return uniform(0.3, 0.7)
    if leaf in ("original1", "weight_v") or name.endswith("codebook.weight"):
        return normal(1.0)
    if leaf == "bias":
        return normal(0.02)
    if name.endswith("norm.weight"):
        return uniform(0.8, 1.2)
    if p.ndim >= 2:
        return normal(_fan_in(model, name, p.shape) ** -0.5)
    raise ValueError(f"no redraw rule for parameter {name} {tuple(p.shape)}")


def _fill_buffers(model: torch.nn.Module, rope_f32: bool) -> None:
    """Recompute every transformer's RoPE table and causal mask (after a meta-device build)."""
    md = upstream().modded_dac
    dtype = torch.float32 if rope_f32 else torch.bfloat16  # bfloat16 = upstream's own table
    for module in model.modules():
        if isinstance(module, md.Transformer):
            cfg = module.config
            n = cfg.block_size
            module.freqs_cis = md.precompute_freqs_cis(n, cfg.head_dim, cfg.rope_base, dtype=dtype)
            module.causal_mask = torch.tril(torch.ones(n, n, dtype=torch.bool))


def build_model(
    cfg: OracleConfig = TINY, seed: int = 0, rope_f32: bool = True, meta: bool | None = None
) -> torch.nn.Module:
    """Upstream DAC in eval mode, every parameter redrawn from ``torch.Generator(seed)``.

    With ``meta`` (default: for latent_dim >= 512) the modules are built on the meta device,
    which skips upstream's init (3 s of the FULL build; it is overwritten anyway) but costs
    ~2 s once per process. Either way every parameter is then drawn in ``named_parameters``
    order and the RoPE tables (float32 if ``rope_f32``) and causal masks computed, so the
    result does not depend on ``meta``.
    """
    if meta is None:
        meta = cfg.latent_dim >= 512
    with torch.device("meta" if meta else "cpu"):
        model = _construct(cfg)
    model = model.to_empty(device="cpu") if meta else model
    gen = torch.Generator().manual_seed(seed)
    last_g = _last_decoder_conv_g(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(_draw(model, name, p, gen, last_g))
    _fill_buffers(model, rope_f32)
    model.oracle_config = cfg
    return model.eval()


def export_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without the RoPE tables and masks (input for the converter)."""
    return {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if not k.endswith(("freqs_cis", "causal_mask"))
    }


# --------------------------------------------------------------------------- running


def _pad_to(audio: np.ndarray, multiple: int) -> torch.Tensor:
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"audio must be 1-D, got shape {audio.shape}")
    x = torch.from_numpy(audio.copy())[None, None]  # (1, 1, n)
    return F.pad(x, (0, -audio.shape[0] % multiple))


def _frame_length(model) -> int:
    return int(model.frame_length)  # hop_length * 4 = 2048 upstream


@torch.inference_mode()
def encode(model, audio: np.ndarray) -> np.ndarray:
    """Codes (n_codebooks, T) int64 from upstream ``DAC.encode`` (pads to a multiple of 2048)."""
    x = torch.from_numpy(np.asarray(audio, dtype=np.float32).copy())[None, None]
    return model.encode(x)[0][0].numpy().astype(np.int64)


@torch.inference_mode()
def encode_padded(model, audio: np.ndarray, multiple: int = 512) -> np.ndarray:
    """Codes with the signal zero-padded on the right to ``multiple`` (512 = the C++ port).

    Runs the same ``model.encoder`` + ``model.quantizer`` that ``DAC.encode`` runs, minus its
    own padding to 2048; with ``multiple=2048`` this equals :func:`encode`.
    """
    z = model.encoder(_pad_to(audio, multiple))
    return model.quantizer(z).codes[0].numpy().astype(np.int64)


@torch.inference_mode()
def decode(model, codes: np.ndarray) -> np.ndarray:
    """Waveform (T * 2048,) float32 from codes (n_codebooks, T)."""
    idx = torch.from_numpy(np.asarray(codes, dtype=np.int64).copy())[None]
    return model.decoder(model.quantizer.decode(idx.clone()))[0, 0].numpy()


@torch.inference_mode()
def latent(model, audio: np.ndarray, multiple: int | None = None) -> np.ndarray:
    """``model.encoder`` output (latent_dim, frames), input padded to ``multiple`` (def. 2048)."""
    return model.encoder(_pad_to(audio, multiple or _frame_length(model)))[0].numpy()


@torch.inference_mode()
def pre_module_output(model, audio: np.ndarray, multiple: int | None = None) -> np.ndarray:
    """Downsample + pre_module output, the VQ input (quantizer_input_dim, T)."""
    return _pre_vq(model, _pad_to(audio, multiple or _frame_length(model)))[0].numpy()


def _pre_vq(model, x: torch.Tensor) -> torch.Tensor:
    q = model.quantizer
    return q.pre_module(q.downsample(model.encoder(x)))


def _stages(model) -> list:
    q = model.quantizer
    return list(q.semantic_quantizer.quantizers) + list(q.quantizer.quantizers)


def _top2_margin(vq, z_e: torch.Tensor) -> torch.Tensor:
    """Best minus second-best score per frame, in cosine units, with upstream's expression.

    Upstream ranks by -dist = 2 cos - |e|^2 - |c|^2 on L2-normalized vectors, so half the
    -dist gap is the cosine gap (up to float rounding of the unit norms).
    """
    enc = F.normalize(z_e[0].transpose(0, 1))  # (T, d)
    book = F.normalize(vq.codebook.weight)
    dist = (  # the expression of dac VectorQuantize.decode_latents
        enc.pow(2).sum(1, keepdim=True) - 2 * enc @ book.t() + book.pow(2).sum(1, keepdim=True).t()
    )
    top = (-dist).topk(2, dim=1).values
    return (top[:, 0] - top[:, 1]) / 2


@torch.inference_mode()
def margins_and_codes(model, audio: np.ndarray, multiple: int | None = None):
    """(margins (n_codebooks, T) float64, codes (n_codebooks, T) int64) from upstream's modules.

    Re-runs upstream's residual loop stage by stage with each ``VectorQuantize`` module's own
    forward (in_proj -> normalize -> codebook -> out_proj), so codes equal ``DAC.encode``'s.
    """
    residual = _pre_vq(model, _pad_to(audio, multiple or _frame_length(model)))
    margins, codes = [], []
    for vq in _stages(model):
        z_q, _, _, idx, z_e = vq(residual)
        margins.append(_top2_margin(vq, z_e))
        codes.append(idx[0])
        residual = residual - z_q
    return (torch.stack(margins).double().numpy(), torch.stack(codes).numpy().astype(np.int64))


def margins(model, audio: np.ndarray, multiple: int | None = None) -> np.ndarray:
    """Per stage and frame: best minus second-best cosine similarity (n_codebooks, T)."""
    return margins_and_codes(model, audio, multiple)[0]
