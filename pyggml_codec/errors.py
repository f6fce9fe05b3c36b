"""The exception classes of the public API.

Every error this library raises on bad input is one of these (or a subclass of a
builtin family, so ``except ValueError`` keeps working for callers that prefer it).
"""

from __future__ import annotations


class CodecError(Exception):
    """Base class of every error raised by pyggml_codec."""


class ModelFileError(CodecError, ValueError):
    """A model file is unreadable, truncated, corrupt or not an S2 codec file."""


class ConfigError(ModelFileError):
    """A ``fish_speech.codec.*`` metadata key is missing, mistyped or impossible."""


class TensorError(ModelFileError):
    """A tensor the configuration implies is missing, mis-shaped, mistyped or unexpected."""


class InputError(CodecError, ValueError):
    """Audio or codes passed to encode/decode are unusable (shape, dtype, values, size)."""


class BackendError(CodecError, RuntimeError):
    """A ggml backend could not be started or cannot run a graph."""


class GraphError(CodecError, RuntimeError):
    """Building, allocating or computing a ggml graph failed."""


class ClosedError(CodecError, RuntimeError):
    """The codec was used after ``close()``."""


class CodeFileError(CodecError, ValueError):
    """A code file is unreadable, truncated, corrupt, of an unknown kind, or cannot be written."""


class AudioFileError(CodecError, ValueError):
    """An audio file cannot be decoded (unknown format, corrupt data, no samples)."""


class PerformanceWarning(UserWarning):
    """The CPU runs a slower path than this install should give (compiled kernels or the BLAS
    missing); the message names the reason and the fix."""


class ExactnessWarning(UserWarning):
    """precision="s2cpp" cannot be bit-exact with s2.cpp here (e.g. a ggml build with LLAMAFILE
    on); the message names the reason and the fix."""


class FetchError(CodecError, OSError):
    """Downloading a model failed: an HTTP error (404, denied), a server without range requests,
    a truncated body, a remote file that changed, the connection, or a full disk. The message
    names the URL or the local file."""
