"""Random-weight upstream models and their GGUF conversions, shared by the test suite."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.utils import parametrize

import oracle
from pyggml_codec.model.convert import convert_checkpoint


@dataclass(frozen=True)
class ConvertedModel:
    """An upstream torch model (eval, random weights) and its f32 / f16 GGUF files."""

    config: oracle.OracleConfig
    model: torch.nn.Module
    f32_path: Path
    f16_path: Path
    seed: int

    def path(self, dtype: str) -> Path:
        return {"f32": self.f32_path, "f16": self.f16_path}[dtype]


def converter_config(cfg: oracle.OracleConfig) -> dict[str, object]:
    """The metadata no tensor shape states, for ``convert_checkpoint(config=...)``."""
    return {
        "rvq_transformer.window_size": cfg.rvq_window,
        "transformer.block_size": cfg.block_size,
        "rvq_transformer.block_size": cfg.rvq_block_size,
        "transformer.head_dim": cfg.head_dim,
        "rvq_transformer.head_dim": cfg.head_dim,
        "sample_rate": cfg.sample_rate,
    }


def make_gguf(model: torch.nn.Module, path: Path, dtype: str) -> Path:
    """Convert an oracle model (built by ``oracle.build_model``) to a GGUF at ``path``."""
    state = oracle.export_state_dict(model)
    config = converter_config(model.oracle_config)
    return convert_checkpoint(state, path, dtype=dtype, config=config)


def make_tiny_gguf(tmpdir: Path, dtype: str = "f32", seed: int = 0) -> tuple[Path, torch.nn.Module]:
    """(GGUF path, torch model) for a TINY model with weights drawn from ``seed``."""
    model = oracle.build_model(oracle.TINY, seed)
    path = make_gguf(model, Path(tmpdir) / f"tiny_{dtype}_s{seed}.gguf", dtype)
    return path, model


def make_converted(cfg: oracle.OracleConfig, tmpdir: Path, seed: int = 0) -> ConvertedModel:
    """Build ``cfg`` from ``seed`` and write both its f32 and f16 GGUF files to ``tmpdir``."""
    model = oracle.build_model(cfg, seed)
    tmpdir = Path(tmpdir)
    paths = {d: make_gguf(model, tmpdir / f"model_{d}_s{seed}.gguf", d) for d in ("f32", "f16")}
    return ConvertedModel(cfg, model, paths["f32"], paths["f16"], seed)


def torch_folded_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict after torch's OWN weight-norm removal (reference for the converter).

    Uses ``parametrize.remove_parametrizations`` and ``torch.nn.utils.remove_weight_norm``
    on a fresh copy (deepcopy fails on legacy weight norm); RoPE tables and masks are dropped.
    """
    state = model.state_dict()
    model = oracle.build_model(model.oracle_config)
    model.load_state_dict(state)
    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
        elif hasattr(module, "weight_g"):
            torch.nn.utils.remove_weight_norm(module)
    return oracle.export_state_dict(model)
