"""pyggml_codec: the Fish Audio S2 Pro neural audio codec on ggml, with graphs built in Python.

    >>> import pyggml_codec
    >>> with pyggml_codec.load("s2-pro-codec.gguf") as codec:   # doctest: +SKIP
    ...     codes = codec.encode(audio)       # (10, T) int32
    ...     wave = codec.decode(codes)        # (T * 2048,) float32

The package's folders are its layers (docs/ARCHITECTURE.md): ``cli`` -> ``tools`` / ``codec``,
``streaming`` -> ``graphs`` -> ``model`` -> ``backend``; ``io`` holds the file formats.
"""

from __future__ import annotations

import sys as _sys

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
from .model.config import CodecConfig
from .streaming import StreamDecoder
from .tools.fetch import fetch

__all__ = [
    "load", "Codec", "CodecConfig", "EncodeResult", "available_backends", "devices", "__version__",
    "CodecError", "ModelFileError", "ConfigError", "TensorError", "InputError", "BackendError", "GraphError",
    "ClosedError", "CodeFileError", "AudioFileError", "PerformanceWarning", "ExactnessWarning", "DeviceInfo", "StreamDecoder",
    "fetch", "FetchError",
]

# The flat module paths of 0.1 (pyggml_codec.audio, .codefiles, .kernels, ...) still import: each
# names the module that now holds its code, the same module object. (pyggml_codec.model is now
# the folder; it hands on the old module's names.)
_MOVED = {
    "audio": "io.audio", "codefiles": "io.codefiles", "diagnostics": "io.dumps", "compare": "tools.compare",
    "bench": "tools.bench", "demo": "tools.demo", "convert": "model.convert", "config": "model.config",
    "gguf_file": "model.gguf_file", "weights": "model.weights", "kernels": "backend.kernels",
    "runtime": "backend.runtime", "winograd": "backend.winograd", "ops": "graphs.ops", "convs": "graphs.convs",
    "transformer": "graphs.transformer", "seanet": "graphs.seanet", "quantizer": "graphs.quantizer",
}


def __getattr__(name: str):
    """``pyggml_codec.audio`` and the other moved modules, imported on first use."""
    if name in _MOVED:
        import importlib

        return importlib.import_module(f"{__name__}.{_MOVED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _MovedModules:
    """A meta-path finder for ``import pyggml_codec.audio`` (and the rest of ``_MOVED``)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        prefix, _, name = fullname.rpartition(".")
        if prefix != __name__ or name not in _MOVED:
            return None
        import importlib
        import importlib.util

        module = importlib.import_module(f"{__name__}.{_MOVED[name]}")
        return importlib.util.spec_from_loader(fullname, _AlreadyLoaded(module))


class _AlreadyLoaded:
    """Hands the import system the module already imported under its new name."""

    def __init__(self, module):
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__ = self.spec  # the import system set the alias's spec on it


_sys.meta_path.append(_MovedModules())
