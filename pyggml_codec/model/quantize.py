"""Quantized codec files: a codec GGUF (merged or codec-only) rewritten with its matrices in one
of ggml's quantized types, in the layout the C++ engine loads (same names, shapes, metadata).

What is quantized: the ``linear`` tensors of the tensor table (``weights.py``): the transformer
matrices (wqkv, wo, w1, w2, w3) and the ConvNeXt pointwise matrices; about 306 M of the 391 M
parameters at S2 Pro size. What stays as stored (F16 or F32), and why:

* conv and conv-transpose kernels: ggml rows are the kernel taps (K = 1..16), which no block
  size (32, 256) divides, and the conv lowerings need F16/F32 kernels;
* norms, biases, Snake alphas, LayerScale gammas, depthwise kernels: vectors, tiny;
* VQ codebooks and projections: the host VQ's cosine search runs on them, and the codes are
  the format's meaning;
* a matrix whose rows the type's block does not divide (a tiny test model under K-quants):
  kept and named in the report;
* every tensor outside the codec (a merged file's language model): copied unchanged.

The file records the choice: ``fish_speech.codec.quantization.type`` (e.g. "Q8_0") and
``fish_speech.codec.quantization.kept_for_block_size`` (the names of the matrices kept).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from ..backend.binding import QUANT_TYPES, block_size, quantize_rows
from ..errors import ModelFileError
from ..progress import ProgressCallback
from ..progress import report as send
from .config import PREFIX, CodecConfig
from .gguf_file import FLOAT_TYPES
from .gguf_write import MetaValue, TensorData, copy_field, copy_tensor, write_gguf
from .loader import codec_prefix, open_model_file
from .weights import check_tensors, expected_tensors, ffn_width_reader

# The types this command writes, and those measured and rejected (benchmarks/bench_quant.py, full
# size, random weights, against the F32 file: README "Quantized weights"). The loader reads all four.
TYPES = {name.lower(): t for t, name in QUANT_TYPES.items() if name in ("Q8_0", "Q6_K")}  # "q8_0" -> ggml type
REJECTED = {
    "q5_k": "decode rel RMS 3.0e-3 (7x the F16 file's), encode codes 48 % equal on clear margins",
    "q4_k": "decode rel RMS 5.9e-3 (14x the F16 file's), encode codes 38-40 % equal on clear margins",
}
TYPE_KEY = PREFIX + "quantization.type"
KEPT_KEY = PREFIX + "quantization.kept_for_block_size"


@dataclass
class QuantizeReport:
    """What ``quantize_file`` did: per tensor name, its type in the new file."""

    source: str
    output: str
    qtype: str
    quantized: list[str] = field(default_factory=list)
    kept_for_block_size: list[str] = field(default_factory=list)
    kept_by_pattern: list[str] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0

    def summary(self) -> str:
        lines = [f"{self.output}: {len(self.quantized)} matrices in {self.qtype}, "
                 f"{self.bytes_in / 1e6:.1f} MB of tensors -> {self.bytes_out / 1e6:.1f} MB"]
        if self.kept_for_block_size:
            lines.append(f"kept as stored, rows not a multiple of the {self.qtype} block: "
                         + _names(self.kept_for_block_size, f" (all in the file's {KEPT_KEY})"))
        if self.kept_by_pattern:
            lines.append("kept as stored (--keep): " + _names(self.kept_by_pattern))
        return "\n".join(lines)


def _names(names: list[str], where: str = "", most: int = 6) -> str:
    more = f" and {len(names) - most} more{where}" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def parse_type(name: str) -> int:
    """The ggml type of a ``--type`` name (case-insensitive); ValueError naming the choices."""
    key = name.lower()
    if key in REJECTED:
        raise ValueError(f"{key.upper()} was measured and rejected for this codec: {REJECTED[key]}; "
                         f"choices: {', '.join(sorted(TYPES))}")
    try:
        return TYPES[key]
    except KeyError:
        raise ValueError(f"unknown quantization type {name!r}; choices: {', '.join(sorted(TYPES))}") from None


def _meta(reader: GGUFReader, qtype: str, kept: list[str]) -> list[MetaValue]:
    """The source's metadata with its types, less its own quantization record, plus this one."""
    skip = (TYPE_KEY, KEPT_KEY, "general.architecture", "general.alignment")
    out = [copy_field(reader, key) for key in reader.fields if key not in skip and not key.startswith("GGUF.")]
    out.append(MetaValue(TYPE_KEY, qtype, GGUFValueType.STRING))
    if kept:
        out.append(MetaValue(KEPT_KEY, kept, GGUFValueType.ARRAY, GGUFValueType.STRING))
    return out


def quantize_file(src: str | os.PathLike, dst: str | os.PathLike, qtype: str = "q8_0",
                  keep: tuple[str, ...] = (), progress: ProgressCallback | None = None) -> QuantizeReport:
    """Write ``dst``: ``src`` with its codec matrices in ``qtype`` ("q8_0" or "q6_k"; see
    ``REJECTED`` for the others). ``keep``: glob patterns (file tensor names) of matrices to leave as stored.
    The source is checked as a codec file first (strictly, as ``load`` does). ``progress`` gets
    "quantize" reports: tensors done, then bytes written."""
    ggml_type = parse_type(qtype)
    mf = open_model_file(str(src))
    prefix = codec_prefix(mf)
    cfg = CodecConfig.from_metadata(mf.metadata)
    specs = expected_tensors(cfg, ffn_width_reader(mf, prefix))
    check_tensors(mf, specs, prefix)
    already = sorted(n for n, t in mf.tensors.items() if n.startswith(prefix) and t.ggml_type not in FLOAT_TYPES)
    if already:
        raise ModelFileError(f"{src}: already quantized ({mf.tensors[already[0]].type_name} {already[0]}); "
                             f"quantize from the F16 or F32 file")
    roles = {prefix + s.name: s.role for s in specs}
    report = QuantizeReport(str(src), str(dst), QUANT_TYPES[ggml_type])
    reader = GGUFReader(str(src))  # checked above: metadata and tensors copied with their types
    tensors = []
    for i, t in enumerate(reader.tensors):
        report.bytes_in += int(t.n_bytes)
        tensors.append(_tensor(t, mf.tensors[t.name], roles.get(t.name), ggml_type, keep, report))
        report.bytes_out += tensors[-1].data.nbytes
        send(progress, "quantize", i + 1, len(reader.tensors), "tensors", t.name)
    write_gguf(Path(dst), mf.architecture, _meta(reader, report.qtype, report.kept_for_block_size), tensors,
               progress=progress, task="quantize")
    return report


def _tensor(t, info, role: str | None, ggml_type: int, keep: tuple[str, ...], report: QuantizeReport) -> TensorData:
    """``t`` (the reader's tensor) as stored, or its blocks in ``ggml_type`` (``info``: the same tensor,
    checked, from the ModelFile)."""
    name = t.name
    stored = copy_tensor(t, name)  # bytes and type unchanged (a merged file's quantized LM too)
    if role != "linear":
        return stored
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in keep):
        report.kept_by_pattern.append(name)
        return stored
    n_per_row = info.ne[0]
    if n_per_row % block_size(ggml_type):
        report.kept_for_block_size.append(name)
        return stored
    rows = np.asarray(info.data, dtype=np.float32).reshape(-1, n_per_row)
    blocks = quantize_rows(rows, ggml_type)
    report.quantized.append(name)
    # the gguf writer takes quantized data as bytes, numpy shape (rows, bytes per row)
    return TensorData(name, blocks.reshape(rows.shape[0], -1), GGMLQuantizationType(ggml_type))
