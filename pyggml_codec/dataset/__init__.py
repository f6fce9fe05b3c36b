"""Corpus encode on Ray Data (the optional extra ``pyggml_codec[ray]``): ``ray_encode``."""

from .ray_encode import MANIFEST, CorpusError, CorpusJob, CorpusReport, encode_corpus  # noqa: F401
