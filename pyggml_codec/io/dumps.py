"""Stage dumps: every stage tensor of one encode or decode in one ``.npz``, written and read.

A dump is one ``.npz``: every stage tensor of one encode or decode, plus the inputs and
outputs, and a ``__meta__`` entry (a JSON string: library version, backend, precision,
model file, stage order, the layout of each stage). Every float stage is stored
channel-first, numpy shape ``(C, T)``, the upstream torch layout without the batch axis,
so a dump of this library and one of the reference (``tools/reference_dump.py``) line up:

    stage                         dump shape         what Codec returns
    codes (decode in, encode out) (n_codebooks, T)   same
    dec.vq_sum, dec.post_module   (input_dim, T)     (T, input_dim): transposed here
    dec.upsample{i}, dec.latent   (input_dim, L)     same
    dec.block{i}                  (C_i, L_i)         same
    dec.pre_tanh                  (1, n)             (n,): a row added here
    audio (decode out)            (n,)               same
    audio (encode in)             (n,)               the float32 mono samples encode saw
    enc.block{i}, latent          (C_i, L_i)         same
    enc.downsample{i}             (input_dim, L_i)   same
    pre_module, enc.vq{i}.residual (input_dim, T)    (T, input_dim): transposed here
    enc.vq{i}.codes               (T,)               same

``enc.vq{i}.residual`` is the residual entering VQ stage i (``enc.vq0.residual`` equals
``pre_module``); ``enc.vq{i}.codes`` is that stage's code row.

Comparison (:func:`compare`, :class:`Report`) lives in :mod:`pyggml_codec.diagnostics.compare`;
the backend benchmark in :mod:`pyggml_codec.diagnostics.bench`; their commands in ``cli/diagnostics.py``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .fileio import atomic_path
from .._version import __version__
from ..model.config import CodecConfig
from ..errors import CodecError

DUMP_FORMAT = "pyggml_codec.dump"
DUMP_VERSION = 1
META_KEY = "__meta__"
# Stages the codec returns time-major, numpy (T, C); the dump transposes them to (C, T).
TIME_MAJOR = ("dec.vq_sum", "dec.post_module", "pre_module", "enc.vq*.residual")

__all__ = [
    "Dump", "DumpError", "load_dump", "save_dump", "is_dump", "dump_meta",
    "decode_stage_shapes", "encode_stage_shapes", "decode_dump", "encode_dump",
]


class DumpError(CodecError, ValueError):
    """A dump cannot be written or read, or a stage does not have its documented shape."""


@dataclass
class Dump:
    """Stage arrays in stage order (numpy shapes, see the module docstring) and the metadata."""

    stages: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def stage_order(self) -> list[str]:
        return list(self.stages)


# --------------------------------------------------------------------------- documented shapes


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def decode_stage_shapes(cfg: CodecConfig, n_frames: int) -> dict[str, tuple[int, ...]]:
    """Every decode dump entry -> its (C, T) shape, in stage order, for ``n_frames`` code frames."""
    d, q = cfg.quantizer.input_dim, cfg.quantizer
    shapes: dict[str, tuple[int, ...]] = {"codes": (q.n_codebooks, n_frames),
                                          "dec.vq_sum": (d, n_frames), "dec.post_module": (d, n_frames)}
    length = n_frames
    for i, factor in enumerate(reversed(q.downsample)):
        length *= factor
        shapes[f"dec.upsample{i}"] = (d, length)
    shapes["dec.latent"] = (d, length)
    for i, rate in enumerate(cfg.decoder.rates):
        length *= rate
        shapes[f"dec.block{i + 1}"] = (cfg.decoder.channels[i + 1], length)
    shapes["dec.pre_tanh"] = (1, length)
    shapes["audio"] = (length,)
    return shapes


def encode_stage_shapes(cfg: CodecConfig, n_samples: int, pad_to: str = "code_frame") -> dict[str, tuple[int, ...]]:
    """Every encode dump entry -> its shape, in stage order, for ``n_samples`` input samples."""
    unit = cfg.samples_per_frame if pad_to == "code_frame" else cfg.frame_length
    length = _ceil_div(n_samples, unit) * unit
    shapes: dict[str, tuple[int, ...]] = {"audio": (n_samples,)}
    for i, rate in enumerate(cfg.encoder.rates):
        length = _ceil_div(length, rate)
        shapes[f"enc.block{i + 1}"] = (cfg.encoder.channels[i + 1], length)
    shapes["latent"] = (cfg.encoder.latent_dim, length)
    d = cfg.quantizer.input_dim
    for i, factor in enumerate(cfg.quantizer.downsample):
        length = _ceil_div(length, factor)
        shapes[f"enc.downsample{i}"] = (d, length)
    shapes["pre_module"] = (d, length)
    for i in range(cfg.n_codebooks):
        shapes[f"enc.vq{i}.residual"] = (d, length)
        shapes[f"enc.vq{i}.codes"] = (length,)
    shapes["codes"] = (cfg.n_codebooks, length)
    return shapes


def _time_major(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in TIME_MAJOR)


def to_dump_layout(name: str, arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The codec's array for stage ``name`` in the dump's layout ``shape``, or DumpError.

    Accepted codec shapes: ``shape`` itself; for time-major stages ``(T, C)``; and the
    forms with a size-1 axis dropped (ggml's download drops trailing 1s of ``ne``).
    """
    arr = np.asarray(arr)
    native = tuple(reversed(shape)) if _time_major(name) else shape
    squeezed = tuple(n for i, n in enumerate(native) if not (i == 0 and n == 1))
    if arr.shape not in (native, squeezed):
        raise DumpError(f"stage {name}: codec array has shape {arr.shape}; expected {native}"
                        f"{' (time-major)' if _time_major(name) else ''} for dump shape {shape}")
    arr = arr.reshape(native)
    return np.ascontiguousarray(arr.T if _time_major(name) else arr)


def _layout_note(name: str, shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return "T" if name != "audio" else "n"
    if name == "codes":
        return "K,T"
    if _time_major(name):
        return "C,T (codec returns T,C: transposed)"
    if name == "dec.pre_tanh":
        return "C,T (C=1; codec returns (n,): row added)"
    return "C,T"


def _arrange(stages: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    missing = [n for n in shapes if n not in stages]
    if missing:
        raise DumpError(f"the codec returned no stage(s) {', '.join(missing)}")
    out = {n: to_dump_layout(n, stages[n], s) for n, s in shapes.items()}
    for name in stages:  # stages this module does not know yet: kept as the codec gave them
        if name not in out:
            out[name] = np.ascontiguousarray(stages[name])
    return out


# --------------------------------------------------------------------------- writing and reading


def dump_meta(kind: str, stages: dict[str, np.ndarray], run: dict[str, Any]) -> dict[str, Any]:
    """A dump's ``__meta__``: the format, ``kind`` ("decode", "encode"), the ``run``'s facts
    (backend, precision, model_file, sample_rate, samples_per_frame, lowerings, options) and
    each stage's layout."""
    model_file = run.get("model_file")
    return {
        "format": DUMP_FORMAT, "format_version": DUMP_VERSION, "kind": kind, "producer": "pyggml_codec",
        "library_version": __version__, **run,
        "model_bytes": os.path.getsize(model_file) if model_file and os.path.isfile(model_file) else None,
        "stage_order": list(stages),
        "layout": {n: _layout_note(n, tuple(a.shape)) for n, a in stages.items()},
    }


def save_dump(path: str | os.PathLike, stages: dict[str, np.ndarray], meta: dict[str, Any]) -> Path:
    """Write stages and ``meta`` (JSON) to one ``.npz``, atomically; ``stage_order`` is set from ``stages``."""
    if META_KEY in stages:
        raise DumpError(f"{META_KEY!r} is reserved for the metadata")
    meta = {**meta, "stage_order": list(stages)}
    entries = {n: np.ascontiguousarray(a) for n, a in stages.items()}
    entries[META_KEY] = np.array(json.dumps(meta, allow_nan=False, default=str))
    path = Path(path)
    if path.suffix.lower() != ".npz":
        raise DumpError(f"{path}: a dump must have the .npz extension")
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **entries)
    return path


def is_dump(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an ``.npz`` with a ``__meta__`` entry (False for unreadable files)."""
    try:
        with zipfile.ZipFile(path) as z:
            return f"{META_KEY}.npy" in z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def load_dump(path: str | os.PathLike) -> Dump:
    """Read a dump written by :func:`save_dump` (or ``tools/reference_dump.py``)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            if META_KEY not in z.files:
                raise DumpError(f"{path}: not a dump (no {META_KEY} entry)")
            meta = json.loads(str(z[META_KEY][()]))
            arrays = {n: z[n] for n in z.files if n != META_KEY}
    except DumpError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError) as exc:
        raise DumpError(f"{path}: unreadable dump ({exc})") from None
    order = [n for n in meta.get("stage_order", []) if n in arrays]
    order += [n for n in arrays if n not in order]
    return Dump({n: arrays[n] for n in order}, meta)


# --------------------------------------------------------------------------- a run's stages as a dump
# (the codec runs and writes: Codec.dump_decode / dump_encode; these only arrange arrays)


def decode_dump(stages: dict[str, np.ndarray], codes: np.ndarray, audio: np.ndarray,
                cfg: CodecConfig) -> dict[str, np.ndarray]:
    """A decode's stages (``Codec.decode_stages``) in the dump's layout and stage order, with its
    input ``codes`` (n_codebooks, T) and output ``audio``."""
    arr = np.asarray(codes)
    arr = arr[0] if arr.ndim == 3 and arr.shape[0] == 1 else arr
    if arr.ndim != 2:
        raise DumpError(f"codes must be (n_codebooks, T), got shape {arr.shape}")
    shapes = decode_stage_shapes(cfg, arr.shape[1])
    return _arrange({**stages, "codes": arr.astype(np.int32), "audio": audio}, shapes)


def encode_dump(stages: dict[str, np.ndarray], audio: np.ndarray, codes: np.ndarray, cfg: CodecConfig,
                pad_to: str = "code_frame") -> dict[str, np.ndarray]:
    """An encode's stages (``Codec.encode_stages``) in the dump's layout and stage order, with the
    float32 mono ``audio`` encode saw (before padding) and its ``codes``."""
    shapes = encode_stage_shapes(cfg, audio.shape[0], pad_to)
    return _arrange({**stages, "audio": audio, "codes": codes}, shapes)
