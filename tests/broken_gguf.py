"""Broken GGUF files, one per failure class, each with the error and reason it must give.

Modelled on the classes of ggml's ``tests/test-gguf.cpp`` (header, key-value section,
tensor infos, data) plus the codec's own layer (architecture, metadata types and values,
tensor table). Every case edits the valid tiny model file (``Gguf`` from
:func:`gguf_craft.read`), except ``small=True`` ones, which edit :func:`gguf_craft.small`.

``absurd=True`` marks files that claim sizes far past the file (huge counts and lengths):
the PyPI ``gguf`` reader loops or allocates per claimed entry on those, so they are loaded
in a child process under a memory and time bound.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import gguf_craft as gc

from pyggml_codec.errors import ConfigError, ModelFileError, TensorError

P = "fish_speech.codec."
U64_MAX = 2**64 - 1
FIRST = "encoder.block.0.conv.weight"  # the first tensor of the tiny file
SECOND = "encoder.block.0.conv.bias"
WQKV = "quantizer.pre_module.layers.0.attention.wqkv.weight"  # ne [64, 192]: Q8_0-compatible
NORM = "quantizer.pre_module.layers.0.attention_norm.weight"  # ne [64]
CODEBOOK = "quantizer.semantic_quantizer.quantizers.0.codebook.weight"  # ne [8, 64]


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[gc.Gguf], bytes]
    error: type
    match: str  # regex searched in the message
    absurd: bool = False
    small: bool = False


def edit(fn: Callable[[gc.Gguf], object]) -> Callable[[gc.Gguf], bytes]:
    def make(template: gc.Gguf) -> bytes:
        g = template.copy()
        fn(g)
        return gc.write(g).data
    return make


def patched(field: str | Callable[[gc.Gguf], str], fmt: str, value, delta: int = 0) -> Callable[[gc.Gguf], bytes]:
    """Write the template unchanged, then overwrite the field at ``offsets[field] + delta``."""
    def make(template: gc.Gguf) -> bytes:
        layout = gc.write(template)
        name = field(template) if callable(field) else field
        return gc.patch(layout.data, layout.offsets[name] + delta, fmt, value)
    return make


def _first_key(g: gc.Gguf) -> str:
    return f"kv:{g.kvs[0].key}"


def _set_tensor(tensor: str, **changes) -> Callable[[gc.Gguf], None]:
    def fn(g: gc.Gguf) -> None:
        t = g.tensor(tensor)
        for k, v in changes.items():
            setattr(t, k, v(t) if callable(v) else v)
    return fn


def _add_kv(key: str, vtype: int, value, itype=None) -> Callable[[gc.Gguf], None]:
    return lambda g: g.kvs.append(gc.KV(key, vtype, value, itype))


def _meta(key: str, vtype: int, value, itype=None) -> Callable[[gc.Gguf], bytes]:
    return edit(lambda g: g.set_kv(P + key, vtype, value, itype))


def _alignment(value: int, vtype: int = gc.UINT32, layout: int = 32) -> Callable[[gc.Gguf], None]:
    def fn(g: gc.Gguf) -> None:
        g.kvs.insert(1, gc.KV("general.alignment", vtype, value))
        g.alignment = layout
    return fn


def _raw_value(key: str, raw: bytes) -> Callable[[gc.Gguf], None]:
    def fn(g: gc.Gguf) -> None:
        kv = g.kv(key)
        kv.vtype, kv.raw = gc.ARRAY, raw
    return fn


def _merged_without_codec(g: gc.Gguf) -> None:
    g.set_kv("general.architecture", gc.STRING, "fish-speech")


def _transformer_in_block_3(g: gc.Gguf) -> None:
    g.set_kv(P + "encoder_transformer_layers", gc.ARRAY, [0, 0, 1, 0], gc.INT32)
    for t in g.tensors:
        t.name = t.name.replace("encoder.block.4.block.5", "encoder.block.3.block.5")


HEADER = [
    Case("bad_magic", patched("version", "4s", b"GGML", -4), ModelFileError, "not a GGUF file"),
    Case("version_0", patched("version", "<I", 0), ModelFileError, "unsupported GGUF version 0"),
    Case("version_1", patched("version", "<I", 1), ModelFileError, "version 1 is obsolete"),
    Case("version_future", patched("version", "<I", 4), ModelFileError, "unsupported GGUF version 4"),
    Case("version_big_endian", patched("version", ">I", 3), ModelFileError, "big-endian"),
    Case("n_tensors_absurd", patched("n_tensors", "<Q", U64_MAX), ModelFileError,
         f"claims {U64_MAX} tensors; the file holds at most", absurd=True),
    Case("n_tensors_2e31", patched("n_tensors", "<Q", 2**31), ModelFileError, "holds at most", absurd=True),
    Case("n_kv_absurd", patched("n_kv", "<Q", U64_MAX), ModelFileError,
         f"claims {U64_MAX} metadata keys", absurd=True),
    Case("n_tensors_one_more", patched("n_tensors", "<Q", 321), ModelFileError, "tensor name 320"),
    Case("n_kv_one_more", patched("n_kv", "<Q", 34), ModelFileError, "."),
    Case("n_kv_one_less", patched("n_kv", "<Q", 32), ModelFileError, "."),
    Case("empty_file", lambda g: b"", ModelFileError, "0 bytes is too short"),
    Case("header_only", lambda g: gc.write(g).data[:24], ModelFileError, "33 metadata keys; the file holds at most 0"),
]

KEY_VALUE = [
    Case("key_size_zero", patched(_first_key, "<Q", 0), ModelFileError, "metadata key 0 has length 0"),
    Case("key_size_huge", patched(_first_key, "<Q", 2**63), ModelFileError,
         "metadata key 0 has length 9223372036854775808", absurd=True),
    Case("key_size_past_end", patched(_first_key, "<Q", 60000), ModelFileError,
         "truncated file: metadata key 0 needs 60000 bytes", small=True),
    Case("key_not_utf8", edit(lambda g: setattr(g.kvs[1], "key", b"\xff\xfe.rate")), ModelFileError,
         "metadata key 1 is not valid UTF-8"),
    Case("value_type_unknown", patched(lambda g: f"kv:{g.kvs[1].key}:type", "<I", 13), ModelFileError,
         "unknown value type 13"),
    Case("value_type_huge", patched(lambda g: f"kv:{g.kvs[1].key}:type", "<I", 2**32 - 1), ModelFileError,
         "unknown value type 4294967295"),
    Case("array_nested", edit(_raw_value(P + "encoder_rates", struct.pack("<IQIQ", gc.ARRAY, 1, gc.INT32, 0))),
         ModelFileError, "encoder_rates' has nested array"),
    Case("array_item_type_unknown", edit(_raw_value(P + "encoder_rates", struct.pack("<IQ", 99, 0))),
         ModelFileError, "unknown value type 99"),
    Case("array_count_absurd", patched(f"kv:{P}encoder_rates:value", "<Q", 2**62, 4), ModelFileError,
         "encoder_rates' claims 4611686018427387904 entries", absurd=True),
    Case("string_size_absurd", patched("kv:general.architecture:value", "<Q", 2**62), ModelFileError,
         "string in 'general.architecture' claims 4611686018427387904 bytes", absurd=True),
    Case("string_not_utf8", _meta("quantizer_type", gc.STRING, b"\xc3\x28"), ModelFileError, "not valid UTF-8"),
    Case("duplicate_key", edit(_add_kv(P + "sample_rate", gc.UINT32, 44100)), ModelFileError,
         f"duplicate metadata key '{P}sample_rate'"),
    Case("alignment_zero", edit(_alignment(0)), ModelFileError, "general.alignment = 0 is not a non-zero power of two"),
    Case("alignment_not_power_of_2", edit(_alignment(48)), ModelFileError, "= 48 is not a non-zero power of two"),
    Case("alignment_wrong_type", edit(_alignment(32, gc.UINT64)), ModelFileError,
         "general.alignment is UINT64, expected UINT32"),
    Case("alignment_inconsistent", edit(_alignment(64, layout=32)), ModelFileError,
         "not a multiple of the alignment 64"),
]

TENSOR_INFO = [
    Case("name_size_zero", patched(f"ti:{FIRST}", "<Q", 0), ModelFileError, "tensor name 0 has length 0"),
    Case("name_size_huge", patched(f"ti:{FIRST}", "<Q", U64_MAX), ModelFileError,
         f"tensor name 0 has length {U64_MAX}", absurd=True),
    Case("name_not_utf8", edit(_set_tensor(SECOND, name=b"enc\xffoder")), ModelFileError,
         "tensor name 1 is not valid UTF-8"),
    Case("n_dims_zero", patched(f"ti:{FIRST}:n_dims", "<I", 0), ModelFileError, "has 0 dimensions"),
    Case("n_dims_five", edit(_set_tensor(SECOND, ne=[4, 1, 1, 1, 1])), ModelFileError, "has 5 dimensions"),
    Case("n_dims_huge", patched(f"ti:{FIRST}:n_dims", "<I", 2**32 - 1), ModelFileError,
         "has 4294967295 dimensions", absurd=True),
    Case("dim_zero", edit(_set_tensor(SECOND, ne=[0])), ModelFileError, r"dimensions \[0\]"),
    Case("dim_negative", edit(_set_tensor(SECOND, ne=[U64_MAX])), ModelFileError, r"each must be in \[1, 2\*\*63\)"),
    Case("dim_huge", edit(_set_tensor(SECOND, ne=[2**62])), ModelFileError, "outside the data", absurd=True),
    Case("dims_product_wraps_u64", edit(_set_tensor(SECOND, ne=[2**32, 2**32])), ModelFileError,
         "outside the data", absurd=True),
    Case("type_unknown", patched(f"ti:{FIRST}:type", "<I", 99), ModelFileError, "unknown ggml type 99"),
    Case("type_removed_q4_2", patched(f"ti:{FIRST}:type", "<I", 4), ModelFileError, "unknown ggml type 4"),
    Case("type_block_mismatch", patched(f"ti:{FIRST}:type", "<I", gc.Q8_0), ModelFileError,
         "ne.0. = 7 is not a multiple of the Q8_0 block size 32"),
    Case("offset_unaligned", edit(_set_tensor(SECOND, offset=36)), ModelFileError,
         "offset 36, not a multiple of the alignment 32"),
    Case("offset_outside", patched(f"ti:{SECOND}:offset", "<Q", 2**63), ModelFileError, "outside the data",
         absurd=True),
    Case("offset_wraps_u64", patched(f"ti:{SECOND}:offset", "<Q", 2**64 - 32), ModelFileError, "outside the data"),
    Case("offset_overlap", edit(_set_tensor(SECOND, offset=0)), ModelFileError, "overlap"),
    Case("duplicate_tensor_name", edit(_set_tensor(SECOND, name=FIRST)), ModelFileError,
         f"duplicate tensor name '{FIRST}'"),
    Case("data_truncated", lambda g: gc.write(g).data[:-100], ModelFileError,
         "truncated file or offset outside the data"),
]

CODEC = [
    Case("arch_other", edit(lambda g: g.set_kv("general.architecture", gc.STRING, "llama")), ModelFileError,
         "'llama'; expected 'fish-speech' or 'fish-speech-codec'"),
    Case("arch_missing", edit(lambda g: g.drop_kv("general.architecture")), ModelFileError,
         "no general.architecture key"),
    Case("arch_wrong_type", edit(lambda g: g.set_kv("general.architecture", gc.UINT32, 7)), ModelFileError,
         "general.architecture is UINT32, expected STRING"),
    Case("merged_without_codec_tensors", edit(_merged_without_codec), ModelFileError,
         "merged fish-speech file without codec tensors"),
    Case("rates_as_string", _meta("encoder_rates", gc.STRING, "2,4,8,8"), ConfigError,
         "encoder_rates is STRING, expected an integer array"),
    Case("rates_as_floats", _meta("encoder_rates", gc.ARRAY, [2.0, 4.0, 8.0, 8.0], gc.FLOAT32), ConfigError,
         r"encoder_rates is ARRAY\[FLOAT32\]"),
    Case("sample_rate_float", _meta("sample_rate", gc.FLOAT32, 44100.0), ConfigError,
         "sample_rate is FLOAT32, expected an integer"),
    Case("hop_length_bool", _meta("hop_length", gc.BOOL, True), ConfigError, "hop_length is BOOL"),
    Case("rope_base_int", _meta("rvq_transformer.rope_freq_base", gc.UINT32, 10000), ConfigError,
         "rope_freq_base is UINT32, expected FLOAT32"),
    Case("key_missing", edit(lambda g: g.drop_kv(P + "hop_length")), ConfigError,
         f"missing metadata key {P}hop_length"),
    Case("value_negative", _meta("hop_length", gc.INT32, -512), ConfigError, "hop_length = -512 is impossible"),
    Case("eps_nan", _meta("rvq_transformer.layer_norm_rms_eps", gc.FLOAT32, float("nan")), ConfigError,
         "must be finite"),
    Case("hop_inconsistent", _meta("hop_length", gc.UINT32, 256), ConfigError, "not the product of encoder_rates"),
    Case("n_layer_absurd", _meta("rvq_transformer.n_layer", gc.UINT32, 2**32 - 1), ConfigError,
         r"n_layer = 4294967295 is impossible \(must be in \[1, 1024\]\)", absurd=True),
    Case("n_codebooks_absurd", _meta("quantizer_residual_codebooks", gc.UINT64, 2**40), ConfigError,
         "quantizer_residual_codebooks = 1099511627776 is impossible", absurd=True),
    Case("rates_array_absurd", _meta("encoder_rates", gc.ARRAY, [1] * 100000, gc.UINT8), ConfigError,
         r"encoder_rates has 100000 entries \(must be 1..16\)", absurd=True),
    Case("head_dim_odd", _meta("rvq_transformer.head_dim", gc.UINT32, 1), ConfigError,
         "head_dim = 1 is odd"),
    Case("n_head_contradicts", _meta("rvq_transformer.n_head", gc.UINT32, 3), ConfigError,
         r"rvq_transformer.n_head = 3 contradicts dim \d+ / head_dim \d+ = \d+"),  # was silently ignored
    Case("window_past_block", _meta("rvq_transformer.window_size", gc.UINT32, 10**9), ConfigError,
         r"window_size = 1000000000 exceeds its block_size = \d+"),  # loaded, then 7.45 GiB per stream
    Case("frame_length_not_hop_multiple", _meta("frame_length", gc.UINT32, 100), ConfigError,
         "frame_length = 100 must be a multiple of hop_length"),
    Case("transformer_in_inner_block", edit(_transformer_in_block_3), ConfigError,
         "only the last encoder block may have transformer layers"),
    Case("tensor_missing", edit(lambda g: g.drop_tensor("decoder.model.0.conv.weight")), TensorError,
         r"missing tensor decoder.model.0.conv.weight \(expected shape \[64, 64, 7\]\)"),
    Case("tensor_wrong_shape", edit(_set_tensor(CODEBOOK, ne=[64, 8])), TensorError,
         rf"{CODEBOOK} has shape \[8, 64\], expected \[64, 8\]"),
    # A Q8_0 matrix is a quantized file's (pyggml-codec quantize); Q4_0 is no type this library
    # takes, and a quantized vector no role that may be quantized.
    Case("tensor_q4_0", edit(_set_tensor(WQKV, ggml_type=2, data=bytes(64 * 192 // 32 * 18))), TensorError,
         f"{WQKV} has unsupported Q4_0; F32 or F16 expected"),
    Case("tensor_q8_0_vector", edit(_set_tensor(NORM, ggml_type=gc.Q8_0, data=bytes(64 // 32 * 34))), TensorError,
         f"{NORM} is Q8_0; quantized types are accepted for the transformer and ConvNeXt matrices only"),
    Case("tensor_bf16", edit(_set_tensor(WQKV, ggml_type=gc.BF16, data=bytes(64 * 192 * 2))), TensorError,
         "has unsupported BF16"),
    Case("tensor_i32", edit(_set_tensor(SECOND, ggml_type=26)), TensorError, "has unsupported I32"),
    Case("tensor_unexpected", edit(lambda g: g.tensors.append(gc.TensorEntry("encoder.extra.weight", 0, [2], bytes(8)))),
         TensorError, "unexpected codec tensor encoder.extra.weight"),
]

CASES = HEADER + KEY_VALUE + TENSOR_INFO + CODEC
