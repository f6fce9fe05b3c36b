"""Loading a model file onto a backend: configuration, strict tensor checks, one weight buffer.

Ownership: a :class:`LoadedModel` frees the weight buffer it allocated and the backend it
started; a backend handed in by the host (``backend=<handle>``) is never freed here.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _ggml
from .config import CodecConfig
from .errors import ModelFileError
from .gguf_file import ModelFile
from .quantizer import VQStage, stage_prefixes
from .runtime import Backend, WeightBuffer
from .weights import PARTS, TensorSpec, backend_array, backend_layout, check_tensors, expected_tensors, ffn_width_reader, host_array

log = logging.getLogger("pyggml_codec")
ARCH_PREFIXES = {"fish-speech": "c.", "fish-speech-codec": ""}


@dataclass
class LoadedModel:
    config: CodecConfig
    backend: Backend
    parts: str
    source: str
    weights: dict[str, Any] = field(default_factory=dict)  # name -> ggml tensor
    vq_stages: list[VQStage] = field(default_factory=list)
    buffer: WeightBuffer | None = None
    loaded_bytes: int = 0
    closed: bool = False

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


def load_model(source: Any, backend: Backend, parts: str, precision: str) -> LoadedModel:
    """Read, check and upload the tensors ``parts`` needs. Frees the backend on failure."""
    try:
        if parts not in PARTS:
            raise ValueError(f"parts must be one of {PARTS}, got {parts!r}")
        mf = open_model_file(source)
        prefix = codec_prefix(mf)
        config = CodecConfig.from_metadata(mf.metadata)
        specs = expected_tensors(config, ffn_width_reader(mf, prefix))
        check_tensors(mf, specs, prefix)
        model = LoadedModel(config=config, backend=backend, parts=parts, source=mf.source)
        wanted = [s for s in specs if parts == "all" or parts in s.parts]
        _upload(model, mf, prefix, [s for s in wanted if s.role != "host"], precision)
        if parts in ("all", "encode"):
            model.vq_stages = _vq_stages(mf, prefix, specs, config)
        log.info("loaded %s: %d tensors, %.1f MB on %s (parts=%s, precision=%s)", mf.source, len(model.weights),
                 model.loaded_bytes / 1e6, backend.name, parts, precision)
        return model
    except BaseException:
        backend.free()
        raise


def _upload(model: LoadedModel, mf: ModelFile, prefix: str, specs: list[TensorSpec], precision: str) -> None:
    """Create every tensor, allocate one buffer, then convert and upload one tensor at a time."""
    buf = WeightBuffer(model.backend, len(specs))
    model.buffer = buf
    for s in specs:
        ggml_type, shape = backend_layout(s, mf.tensors[prefix + s.name].ggml_type, precision)
        t = buf.new_tensor(ggml_type, tuple(reversed(shape)))
        _ggml.set_name(t, f"w{len(model.weights)}")  # checkpoint names can exceed ggml's 63 bytes
        model.weights[s.name] = t
    model.loaded_bytes = buf.allocate()
    for s in specs:
        _ggml.upload(model.weights[s.name], backend_array(mf, prefix, s, precision))


def _vq_stages(mf: ModelFile, prefix: str, specs: list[TensorSpec], cfg: CodecConfig) -> list[VQStage]:
    by_name = {s.name: s for s in specs}

    def arr(name: str) -> np.ndarray:
        return host_array(mf, prefix, by_name[name])

    return [
        VQStage.from_arrays(arr(f"{p}.in_proj.weight"), arr(f"{p}.in_proj.bias"), arr(f"{p}.out_proj.weight"),
                            arr(f"{p}.out_proj.bias"), arr(f"{p}.codebook.weight"))
        for p in stage_prefixes(cfg.quantizer.n_residual)
    ]
