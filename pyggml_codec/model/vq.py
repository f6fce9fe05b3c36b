"""The quantizer's host half (numpy): codebook caches built once at load, cosine search as one
matrix product per stage, residual subtraction; semantic stage first, then the residual stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SEMANTIC = "quantizer.semantic_quantizer.quantizers.0"


def stage_prefixes(n_residual: int) -> list[str]:
    """Tensor prefixes of the VQ stages in code order: semantic first."""
    return [SEMANTIC] + [f"quantizer.quantizer.quantizers.{i}" for i in range(n_residual)]



def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows divided by sqrt(max(|row|^2, 1e-12)), the C++ engine's clamp (upstream clamps |row| at 1e-12)."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.sqrt(np.maximum(np.sum(x * x, axis=-1, keepdims=True), np.float32(1e-12)))


@dataclass(frozen=True)
class VQStage:
    """One VQ stage's host cache (float32): projections and both codebook forms."""

    in_w: np.ndarray  # (codebook_dim, input_dim)
    in_b: np.ndarray  # (codebook_dim,)
    out_w: np.ndarray  # (input_dim, codebook_dim)
    out_b: np.ndarray  # (input_dim,)
    codebook: np.ndarray  # (size, codebook_dim), raw
    codebook_unit: np.ndarray  # (size, codebook_dim), L2-normalized

    @classmethod
    def from_arrays(cls, in_w, in_b, out_w, out_b, codebook) -> "VQStage":
        f = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
        cb = f(codebook)
        return cls(f(in_w).reshape(cb.shape[1], -1), f(in_b), f(out_w).reshape(-1, cb.shape[1]), f(out_b),
                   cb, l2_normalize(cb))

    def quantize(self, residual: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes [T], projection [T, input_dim], margin [T]) for residual [T, input_dim]."""
        latent = residual @ self.in_w.T + self.in_b
        scores = l2_normalize(latent) @ self.codebook_unit.T  # [T, size]
        codes = np.argmax(scores, axis=1)  # first index wins ties
        proj = self.codebook[codes] @ self.out_w.T + self.out_b
        return codes.astype(np.int32), proj, _margins(scores, codes)


def _margins(scores: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Best minus second-best cosine per row (inf when the codebook has one entry)."""
    if scores.shape[1] < 2:
        return np.full(scores.shape[0], np.inf, dtype=np.float32)
    best = scores[np.arange(scores.shape[0]), codes]
    second = np.partition(scores, -2, axis=1)[:, -2]
    return (best - second).astype(np.float32)


def residual_quantize(stages: list[VQStage], z: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Codes (n_stages, T), margins (n_stages, T) and the residual entering each stage."""
    residual = np.array(z, dtype=np.float32, copy=True)
    codes, margins, residuals = [], [], []
    for stage in stages:
        residuals.append(residual.copy())
        c, proj, m = stage.quantize(residual)
        residual -= proj
        codes.append(c)
        margins.append(m)
    return np.stack(codes), np.stack(margins), residuals
