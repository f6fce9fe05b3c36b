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


def _affine(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x [T, n] . w [m, n]^T (+ b [m]) as one BLAS product."""
    y = x @ w.T
    return y if b is None else y + b


def sequential_affine(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x [T, n] . w [m, n]^T (+ b [m]) in float32 with the C++ engine's loop order: for each
    output, ``v = b; v += w[0] x[0]; v += w[1] x[1]; ...``, every product and sum rounded to
    float (no FMA), vectorized over T and m only. ``b=None`` starts from 0."""
    x, w = np.asarray(x, np.float32), np.asarray(w, np.float32)
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    if b is not None:
        acc += np.asarray(b, np.float32)
    for i in range(x.shape[1]):
        acc += x[:, i:i + 1] * w[:, i]
    return acc


def sequential_unit(x: np.ndarray) -> np.ndarray:
    """Rows over sqrt(max(sum of squares, 1e-12)), the sum in element order, as s2.cpp's VQ cache."""
    x = np.asarray(x, np.float32)
    sq = np.zeros(x.shape[:-1] + (1,), np.float32)
    for d in range(x.shape[-1]):
        sq += x[..., d:d + 1] * x[..., d:d + 1]
    return x / np.sqrt(np.maximum(sq, np.float32(1e-12)))


@dataclass(frozen=True)
class VQStage:
    """One VQ stage's host cache (float32): projections and both codebook forms.

    ``sequential`` (the "s2cpp" precision): every dot product in the C++ engine's scalar loop
    order (:func:`sequential_affine`), so that codes, residuals and margins are s2.cpp's bit for
    bit; otherwise BLAS matrix products (faster, the same values to float rounding).
    """

    in_w: np.ndarray  # (codebook_dim, input_dim)
    in_b: np.ndarray  # (codebook_dim,)
    out_w: np.ndarray  # (input_dim, codebook_dim)
    out_b: np.ndarray  # (input_dim,)
    codebook: np.ndarray  # (size, codebook_dim), raw
    codebook_unit: np.ndarray  # (size, codebook_dim), L2-normalized
    sequential: bool = False

    @classmethod
    def from_arrays(cls, in_w, in_b, out_w, out_b, codebook, sequential: bool = False) -> "VQStage":
        f = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
        cb = f(codebook)
        unit = sequential_unit(cb) if sequential else l2_normalize(cb)
        return cls(f(in_w).reshape(cb.shape[1], -1), f(in_b), f(out_w).reshape(-1, cb.shape[1]), f(out_b),
                   cb, unit, sequential)

    def quantize(self, residual: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes [T], projection [T, input_dim], margin [T]) for residual [T, input_dim]."""
        affine, unit = (sequential_affine, sequential_unit) if self.sequential else (_affine, l2_normalize)
        scores = affine(unit(affine(residual, self.in_w, self.in_b)), self.codebook_unit, None)  # [T, size]
        codes = np.argmax(scores, axis=1)  # first index wins ties
        proj = affine(self.codebook[codes], self.out_w, self.out_b)
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
