"""The plan: every choice of how a loaded model computes, decided once in ``load()``.

:func:`decide_plan` takes the backend (what it supports, its quirks: ``backend/quirks.py``),
the user's options (precision, ``lowerings=``, ``decode_path``) and returns a frozen
:class:`Plan`. The loader lays the weights out for it, the graph builders read it, the engine
runs by it, ``codec.plan`` returns it and ``info`` / ``doctor`` print it. Nothing after
``load()`` decides again, and no module but this one tests a precision's name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Literal

from .backend.lowerings import choose_lowerings
from .backend.runtime import Backend

DECODE_PATHS = ("auto", "split", "fused")
DECODE_CHUNK_FRAMES = 32  # about 1.5 s: the split decode's chunk on the CPU in "f32" (Plan.decode_chunk_frames)


class Precision(str, Enum):
    """What a codec computes in: ``F32`` (F32 weights and convs, ~1e-6 from upstream PyTorch) or
    ``S2CPP`` (the C++ engine's F16 conv inputs and weights and its formulations, bit for bit)."""

    F32 = "f32"
    S2CPP = "s2cpp"

    @classmethod
    def parse(cls, value) -> "Precision":
        """``value`` ("f32", "s2cpp" or a Precision) as a Precision; ValueError otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"precision must be 'f32' or 's2cpp', got {value!r}") from None

    @property
    def reproduces_s2cpp(self) -> bool:
        """The C++ engine's sums, bit for bit: its lowerings, F16 convs, the exact kernels."""
        return self is Precision.S2CPP

    @property
    def f32_products(self) -> bool:
        """Whether matrix products must take F32 inputs as they are (no F16 rounding)."""
        return self is Precision.F32


PRECISIONS = tuple(p.value for p in Precision)  # ("f32", "s2cpp")


@dataclass(frozen=True)
class Plan:
    """How one loaded model computes: ``codec.plan``, decided once by :func:`decide_plan` in
    ``load()`` and frozen.

    ``precision`` is a :class:`Precision`. The lowering fields (``mask``, ``conv_transpose``,
    ``left_pad``, ``kernels``, ``attention``, ``matmul``, ``conv``, ``quantized``, ``matrices``,
    ``kv``) take the values of ``lowerings.LOWERING_CHOICES``, chosen per backend or forced by
    ``load(..., lowerings={...})``. ``products`` is a fact of the backend, not a choice: "f32",
    "f16-inputs" or "unmeasured". ``decode`` is what ``decode_path="auto"`` runs ("fused" on GPU
    backends, "split" on the CPU), and ``decode_chunk_frames`` the length past which a split
    decode runs as an exact stream of chunks (32 on the CPU in "f32", else None). The docs'
    "Precision and plan" page describes each value.
    """

    precision: Precision
    mask: Literal["diag_mask_inf", "explicit"]  # causal masks: ggml's op, or explicit mask tensors (Metal)
    conv_transpose: Literal["col2im", "ggml"]
    left_pad: Literal["pad_ext", "concat"]
    kernels: bool  # the compiled CPU kernels (kernels.py)
    attention: Literal["fused", "blocked", "full"]
    matmul: Literal["blas", "ggml"]  # F32 products through the BLAS numpy ships, or ggml's mul_mat
    conv: Literal["winograd", "taps", "im2col"]  # the residual units' dilated convs
    quantized: Literal["native", "dequantize"]  # products with a quantized weight
    matrices: Literal["stored", "f32"]  # an F16 file's matrices in "f32": held as stored, or upcast at load
    kv: Literal["arena", "concat"]  # streamed attention's keys and values
    products: str  # how the backend computes F32 products (runtime.PRODUCTS): not a choice, a fact
    decode: Literal["fused", "split"]  # what decode_path "auto" runs: one graph codes -> wave, or two
    decode_chunk_frames: int | None  # split decodes longer than this run as an exact stream of chunks

    @property
    def reproduces_s2cpp(self) -> bool:
        """Whether this plan computes the C++ engine's sums bit for bit (the "s2cpp" precision)."""
        return self.precision.reproduces_s2cpp

    @property
    def ru_weights(self) -> Literal["winograd", "taps", "conv"]:
        """How the residual units' dilated conv weights are held: re-laid for Winograd or per tap
        (the BLAS convs, in "f32"), else as convs ("s2cpp" keeps F16 im2col columns, as the C++
        engine does)."""
        return self.conv if not self.reproduces_s2cpp and self.conv in ("taps", "winograd") else "conv"

    def fused(self, decode_path: str) -> bool:
        """Whether ``decode_path`` ("auto", "split", "fused") runs the fused decode graph."""
        return decode_path == "fused" or (decode_path == "auto" and self.decode == "fused")

    def as_dict(self) -> dict[str, object]:
        """Every field by name, the precision as its string (for ``info``, ``doctor``, JSON)."""
        return {**asdict(self), "precision": self.precision.value}

    def describe(self) -> str:
        """One line per field: ``name  value``."""
        return "\n".join(f"{k:<20}{v}" for k, v in self.as_dict().items())


def check_decode_path(path: str) -> str:
    if path not in DECODE_PATHS:
        raise ValueError(f"decode_path must be one of {DECODE_PATHS}, got {path!r}")
    return path


def decide_plan(backend: Backend, precision: Precision, overrides: dict | None = None) -> Plan:
    """The plan for ``precision`` on ``backend`` with the user's ``lowerings=`` ``overrides``,
    validated (ValueError or BackendError naming the clash)."""
    lowerings = choose_lowerings(backend, overrides, exact=precision.reproduces_s2cpp)
    chunk = DECODE_CHUNK_FRAMES if backend.is_cpu and not precision.reproduces_s2cpp else None
    # None: GPU backends and "s2cpp" decode in one graph at any length (up to inputs.MAX_DECODE_FRAMES),
    # as the C++ engine does (in "s2cpp" chunks would move its F16 roundings: 2e-4 rel RMS, tiny model)
    return Plan(precision=precision, **lowerings, decode="split" if backend.is_cpu else "fused",
                decode_chunk_frames=chunk)
