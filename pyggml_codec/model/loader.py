"""Loading a model file onto a backend: configuration, strict tensor checks, one weight buffer.

Ownership: a :class:`LoadedModel` frees the weight buffer it allocated and the backend it
started, in that order; a backend handed in by the host (``backend=<handle>``) and tensors
the host allocated (``host_tensors``) are never freed here, and must outlive the codec.
"""

from __future__ import annotations

import ctypes
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..backend import binding, buildinfo
from ..backend.binding import QUANT_TYPES
from ..backend.ggml_graph import WeightBuffer
from ..backend.runtime import Backend
from ..errors import ExactnessWarning, ModelFileError
from ..plan import Plan, Precision, decide_plan
from .config import CodecConfig
from .gguf_file import ModelFile
from .vq import VQStage, stage_prefixes
from .weights import PARTS, TensorSpec, backend_array, backend_layout, check_tensors, expected_tensors, ffn_width_reader, host_array

log = logging.getLogger("pyggml_codec")
ARCH_PREFIXES = {"fish-speech": "c.", "fish-speech-codec": ""}


@dataclass
class LoadedModel:
    config: CodecConfig
    backend: Backend
    parts: str
    source: str
    plan: Plan  # how it computes, decided once (plan.decide_plan); the weights are laid out for it
    weights: dict[str, Any] = field(default_factory=dict)  # name -> ggml tensor
    vq_stages: list[VQStage] = field(default_factory=list)
    buffer: WeightBuffer | None = None
    loaded_bytes: int = 0  # bytes of the weight buffer this codec allocated
    shared: set[str] = field(default_factory=set)  # tensors used in place from the host
    closed: bool = False

    @property
    def huge_pages(self) -> bool:
        """Whether this codec's weight buffer was advised to huge pages (binding.advise_huge_pages)."""
        return self.buffer is not None and self.buffer.huge_pages

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.weights.clear()
        if self.buffer is not None:
            self.buffer.free()
        self.backend.free()


def open_model_file(source: Any) -> ModelFile:
    if isinstance(source, ModelFile):
        return source
    if isinstance(source, (str, os.PathLike)):
        return ModelFile.open(source)
    return ModelFile.from_reader(source)


def codec_prefix(mf: ModelFile) -> str:
    arch = mf.architecture
    if arch not in ARCH_PREFIXES:
        raise ModelFileError(
            f"{mf.source}: general.architecture is {arch!r}; expected 'fish-speech' or 'fish-speech-codec'"
        )
    prefix = ARCH_PREFIXES[arch]
    if prefix and not any(name.startswith(prefix) for name in mf.tensors):
        raise ModelFileError(f"{mf.source}: merged fish-speech file without codec tensors (no 'c.' names)")
    return prefix


def load_model(source: Any, backend: Backend, parts: str, precision: Precision,
               host_tensors: Mapping[str, Any] | None = None, lowerings: dict | None = None) -> LoadedModel:
    """Read, check and upload the tensors ``parts`` needs. Frees what it made on failure.

    ``host_tensors`` maps file tensor names (with the file's prefix) to ggml tensors the
    host already holds on ``backend``; those whose type and shape are what this codec
    would create are used in place (never freed here), the others are copied. The plan
    (:func:`~pyggml_codec.plan.decide_plan`) is decided here, from the backend, ``precision``
    and the ``lowerings`` overrides, and recorded on the model.
    """
    model = None
    try:
        if parts not in PARTS:
            raise ValueError(f"parts must be one of {PARTS}, got {parts!r}")
        mf = open_model_file(source)
        prefix = codec_prefix(mf)
        config = CodecConfig.from_metadata(mf.metadata)
        specs = expected_tensors(config, ffn_width_reader(mf, prefix))
        check_tensors(mf, specs, prefix)
        plan = decide_plan(backend, precision, lowerings)
        _warn_quantized_s2cpp(mf, prefix, plan)
        if plan.reproduces_s2cpp and backend.is_cpu:
            _warn_s2cpp_build()
        model = LoadedModel(config=config, backend=backend, parts=parts, source=mf.source, plan=plan)
        wanted = [s for s in specs if (parts == "all" or parts in s.parts) and s.role != "host"]
        _upload(model, mf, prefix, wanted, _checked_host_tensors(host_tensors))
        if parts in ("all", "encode"):
            model.vq_stages = _vq_stages(mf, prefix, specs, config, sequential=plan.reproduces_s2cpp)
        log.info("loaded %s: %d tensors (%d shared with the host), %.1f MB on %s (parts=%s, precision=%s)",
                 mf.source, len(model.weights), len(model.shared), model.loaded_bytes / 1e6, backend.name, parts,
                 plan.precision.value)
        return model
    except BaseException:
        if model is not None and model.buffer is not None:
            model.buffer.free()
        backend.free()
        raise


def _warn_s2cpp_build() -> None:
    """An ExactnessWarning when this ggml build cannot give s2.cpp's bits (buildinfo.s2cpp_exactness)."""
    exactness = buildinfo.s2cpp_exactness()
    if exactness["exact"] is False:
        warnings.warn(exactness["reason"], ExactnessWarning, stacklevel=4)


def _warn_quantized_s2cpp(mf: ModelFile, prefix: str, plan: Plan) -> None:
    """s2cpp mode exists to reproduce the C++ engine's F16 rounding; on a quantized file that
    reproduction is not established (the engine's quantized path was never compared)."""
    quantized = [n for n, t in mf.tensors.items() if n.startswith(prefix) and t.ggml_type in QUANT_TYPES]
    if plan.reproduces_s2cpp and quantized:
        warnings.warn(f"{mf.source}: precision='s2cpp' on a quantized file ({len(quantized)} quantized matrices, "
                      f"e.g. {quantized[0]}): parity with the C++ engine is not established for quantized "
                      f"weights", RuntimeWarning,
                      stacklevel=4)


def _checked_host_tensors(host_tensors: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``host_tensors`` with every value a non-NULL ggml tensor pointer, else TypeError naming the entry
    (an int or an array reached ggml's struct reads as an AttributeError, or worse)."""
    if host_tensors is None:
        return {}
    if not isinstance(host_tensors, Mapping):
        raise TypeError(f"host_tensors must map tensor names to ggml tensors, got {type(host_tensors).__name__}")
    tensor_p = ctypes.POINTER(binding.lib.ggml_tensor)
    for name, tensor in host_tensors.items():
        if not isinstance(tensor, tensor_p) or not tensor:
            raise TypeError(f"host_tensors[{name!r}] must be a ggml tensor (ggml_tensor_p), got "
                            f"{'NULL' if isinstance(tensor, tensor_p) else type(tensor).__name__}")
    return host_tensors


def _usable_in_place(tensor: Any, ggml_type: int, shape: tuple[int, ...]) -> bool:
    want = tuple(reversed(shape)) + (1,) * (4 - len(shape))
    return (binding.tensor_type(tensor) == ggml_type and tuple(int(tensor.contents.ne[i]) for i in range(4)) == want
            and bool(binding.lib.ggml_is_contiguous(tensor)) and bool(tensor.contents.buffer))


def _upload(model: LoadedModel, mf: ModelFile, prefix: str, specs: list[TensorSpec],
            host_tensors: Mapping[str, Any]) -> None:
    """Create every tensor not shared with the host, allocate one buffer, then convert and
    upload one tensor at a time."""
    own = []
    for s in specs:
        ggml_type, shape = backend_layout(s, mf.tensors[prefix + s.name].ggml_type, model.plan)
        host = host_tensors.get(prefix + s.name)
        if host is not None and _usable_in_place(host, ggml_type, shape):
            model.weights[s.name] = host
            model.shared.add(s.name)
        else:
            own.append((s, ggml_type, shape))
    if not own:
        return
    buf = WeightBuffer(model.backend, len(own))
    model.buffer = buf
    for s, ggml_type, shape in own:
        t = buf.new_tensor(ggml_type, tuple(reversed(shape)))
        binding.set_name(t, f"w{len(model.weights)}")  # checkpoint names can exceed ggml's 63 bytes
        model.weights[s.name] = t
    model.loaded_bytes = buf.allocate()
    for s, _, _ in own:
        binding.upload(model.weights[s.name], backend_array(mf, prefix, s, model.plan))


def _vq_stages(mf: ModelFile, prefix: str, specs: list[TensorSpec], cfg: CodecConfig,
               sequential: bool = False) -> list[VQStage]:
    by_name = {s.name: s for s in specs}

    def arr(name: str) -> np.ndarray:
        return host_array(mf, prefix, by_name[name])

    return [
        VQStage.from_arrays(arr(f"{p}.in_proj.weight"), arr(f"{p}.in_proj.bias"), arr(f"{p}.out_proj.weight"),
                            arr(f"{p}.out_proj.bias"), arr(f"{p}.codebook.weight"), sequential)
        for p in stage_prefixes(cfg.quantizer.n_residual)
    ]
