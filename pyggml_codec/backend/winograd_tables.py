"""Winograd minimal filtering for the residual units' dilated convs: the tables of F(m, K).

Built exactly (``fractions``) by Toom-Cook on chosen points and infinity, for the
correlation the convs compute: y = A ((G w) * (BT x)), m outputs from n = m + K - 1
inputs with n products instead of m K. The compiled kernel (winograd_conv.conv_wino) reads BT
and A; G transforms the weights once, at load (``Winograd.weights``). Pure numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np


def _inverse(rows: list) -> list:
    """Exact inverse of a square matrix of Fractions (Gauss-Jordan)."""
    n = len(rows)
    a = [list(r) + [Fraction(int(i == j)) for j in range(n)] for i, r in enumerate(rows)]
    for c in range(n):
        pivot = next(r for r in range(c, n) if a[r][c] != 0)
        a[c], a[pivot] = a[pivot], a[c]
        a[c] = [v / a[c][c] for v in a[c]]
        for r in range(n):
            if r != c and a[r][c] != 0:
                f = a[r][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
    return [r[n:] for r in a]


@dataclass(frozen=True)
class Winograd:
    """Winograd F(m, K) for a correlation (Toom-Cook on the given points and infinity):
    y = A ((G w) * (BT x)) for m outputs from n = m + K - 1 inputs. BT's rows are scaled to
    coprime integers (exact in float32), G's rows by the inverse scale."""

    m: int
    k: int
    points: tuple
    bt: np.ndarray  # n x n
    a: np.ndarray  # m x n
    g: np.ndarray  # n x K (float64)
    g_pinv: np.ndarray  # K x n: per-tap weights back from the transformed ones
    tables: np.ndarray  # F32 BT then A, as the kernel reads them

    @property
    def n(self) -> int:
        return self.m + self.k - 1

    @classmethod
    def build(cls, m: int, k: int, points) -> "Winograd":
        n = m + k - 1
        if len(points) != n - 1:
            raise ValueError(f"F({m},{k}) needs {n - 1} finite points, got {len(points)}")

        def vandermonde(length: int) -> list:  # rows: the points, then infinity
            rows = [[Fraction(p) ** i for i in range(length)] for p in points]
            return rows + [[Fraction(0)] * (length - 1) + [Fraction(1)]]

        vm, vk, vinv = vandermonde(m), vandermonde(k), _inverse(vandermonde(n))
        a = [[vm[p][i] for p in range(n)] for i in range(m)]
        g = [row[:] for row in vk]
        bt = [[vinv[j][p] for j in range(n)] for p in range(n)]  # the inverse's transpose
        for p in range(n):
            den = math.lcm(*[v.denominator for v in bt[p]])
            scale = Fraction(den, math.gcd(*[int(v * den) for v in bt[p]]))
            bt[p] = [v * scale for v in bt[p]]
            g[p] = [v / scale for v in g[p]]

        def f64(rows: list) -> np.ndarray:
            return np.array([[float(v) for v in row] for row in rows])

        bt_, a_, g_ = f64(bt), f64(a), f64(g)
        tables = np.concatenate([bt_.ravel(), a_.ravel()]).astype(np.float32)
        return cls(m, k, tuple(points), bt_, a_, g_, np.linalg.pinv(g_), tables)

    def weights(self, taps: np.ndarray) -> np.ndarray:
        """Per-tap matrices ``(K, Cout, Cin)`` -> the transformed ones ``(n, Cout, Cin)``, F32
        (summed in float64, so each is rounded once)."""
        k, cout, cin = taps.shape
        if k != self.k:
            raise ValueError(f"Winograd F({self.m},{self.k}) needs kernel size {self.k}, got {k}")
        u = self.g @ taps.reshape(k, -1).astype(np.float64)
        return np.ascontiguousarray(u.reshape(self.n, cout, cin).astype(np.float32))


_HALF = Fraction(1, 2)
VARIANTS = {  # points chosen for the smallest float32 error measured per conv
    2: Winograd.build(2, 7, (0, 1, -1, 2, -2, _HALF, -_HALF)),
    4: Winograd.build(4, 7, (0, 1, -1, 2, -2, _HALF, -_HALF, Fraction(3, 4), Fraction(-3, 4))),
}
# F(4,7): 10 GEMMs per 4 outputs (0.36x the per-tap FLOPs; F(2,7): 0.57x). Per conv, float32
# error 5-8e-6 of the largest output against 1-2e-6 for F(2,7) and 2e-7 per tap; end to end
# (full-size decode against upstream, rel RMS) 1.2e-6 against 8e-7 per tap.
WINOGRAD = VARIANTS[4]
