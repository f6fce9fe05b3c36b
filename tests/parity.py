"""Error metrics shared by the parity tests; each test states its metric and tolerance."""

from __future__ import annotations

import numpy as np


def rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    """sqrt(mean((got - want)^2) / mean(want^2))."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.sqrt(np.mean((got - want) ** 2) / max(np.mean(want**2), 1e-30)))


def max_abs(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))))


def report(label: str, got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    r, m = rel_rms(got, want), max_abs(got, want)
    print(f"{label}: rel RMS {r:.3e}, max abs {m:.3e}")
    return r, m


def random_codes(sizes, n_frames: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, s, n_frames) for s in sizes]).astype(np.int64)


def signal(n: int, seed: int) -> np.ndarray:
    """Noise plus two tones, amplitude well inside [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 44100.0
    x = 0.2 * rng.standard_normal(n) + 0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 3000 * t)
    return x.astype(np.float32)


def code_agreement(got: np.ndarray, want: np.ndarray, margins: np.ndarray, threshold: float = 1e-4,
                   min_clear: float = 0.5):
    """(fraction equal where the reference margin > threshold, count not compared, overall fraction).

    Codes are ``[codebook, frame]``, each codebook quantizing what the ones before it in the frame
    left (the semantic code, then the residual ones): where a code at a near-tie differs, the later
    codebooks of its frame quantize another residual, whatever their margins, and are not compared
    either. At least ``min_clear`` of the codes must be compared: otherwise the first number
    would speak for a handful of codes (or none), and the comparison fails instead."""
    clear = margins > threshold
    eq = got == want
    assert eq.shape == clear.shape, (eq.shape, clear.shape)
    flipped = ~clear & ~eq  # near-tie codes that differ
    if eq.ndim == 2 and flipped.any():
        after = np.cumsum(flipped, axis=0) - flipped > 0  # a near-tie flip earlier in the frame
        clear = clear & ~after
    assert clear.mean() >= min_clear, (f"only {int(clear.sum())} of {clear.size} codes have a margin > {threshold}: "
                                       f"too few to compare codes")
    return float(eq[clear].mean()), int((~clear).sum()), float(eq.mean())
