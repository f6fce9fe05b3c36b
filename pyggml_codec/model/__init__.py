"""What a model file holds: GGUF parsing (``gguf_file``), the configuration (``config``), the
tensor table and strict checks (``weights``), the VQ codebooks on the host (``vq``), loading onto
a backend (``loader``), and the converter with its layout (``convert``, ``layout``, ``gguf_write``).

``from pyggml_codec.model import load_model`` (the flat module of 0.1) keeps working."""

from .loader import ARCH_PREFIXES, LoadedModel, codec_prefix, load_model, open_model_file  # noqa: F401
