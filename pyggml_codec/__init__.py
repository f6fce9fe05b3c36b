"""pyggml_codec: the Fish Audio S2 Pro neural audio codec on ggml, with graphs built in Python.

    >>> import pyggml_codec
    >>> with pyggml_codec.load("s2-pro-codec.gguf") as codec:   # doctest: +SKIP
    ...     codes = codec.encode(audio)       # (10, T) int32
    ...     wave = codec.decode(codes)        # (T * 2048,) float32

The package's folders are its layers (docs/ARCHITECTURE.md): ``cli`` -> ``dataset`` ->
``diagnostics`` / ``hub`` -> ``codec`` (the front) -> ``batching`` / ``streaming`` -> ``engine`` ->
``graphs`` -> ``model`` -> ``plan`` -> ``backend``; ``io`` holds the file formats (audio:
``pyggml_codec.io.audio``).
"""

from __future__ import annotations

from ._version import __version__
from .api import load
from .backend.runtime import DeviceInfo, available_backends, devices
from .codec import Codec
from .errors import (
    AudioFileError,
    BackendError,
    ClosedError,
    CodecError,
    CodeFileError,
    ConfigError,
    GraphError,
    InputError,
    ModelFileError,
    PerformanceWarning,
    ExactnessWarning,
    FetchError,
    TensorError,
)
from .inputs import EncodeResult
from .plan import Plan, Precision
from .model.config import CodecConfig
from .streaming import StreamDecoder
from .hub.fetch import fetch

__all__ = [
    "load", "Codec", "CodecConfig", "EncodeResult", "available_backends", "devices", "__version__",
    "CodecError", "ModelFileError", "ConfigError", "TensorError", "InputError", "BackendError", "GraphError",
    "ClosedError", "CodeFileError", "AudioFileError", "PerformanceWarning", "ExactnessWarning", "DeviceInfo", "StreamDecoder",
    "Plan", "Precision", "fetch", "FetchError",
]
