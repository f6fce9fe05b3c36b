"""Quantized codec files (``pyggml-codec quantize``, model/quantize.py) on the tiny model: the
written file, the loader's strictness, and the error per type against the F32 file.

The tiny model's matrices have rows of 64, 192 and 256: Q8_0 (blocks of 32) quantizes all of
them; Q6_K (blocks of 256) only the ConvNeXt pwconv2 matrices, and keeps the rest, named in the
report. The tiny model's random weights make these bounds a lower bound on
trouble, not a quality verdict (benchmarks/bench_quant.py measures the full size).
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

import pyggml_codec
from parity import random_codes, signal
from pyggml_codec.backend import binding
from pyggml_codec.errors import ModelFileError, TensorError
from pyggml_codec.model.quantize import KEPT_KEY, TYPE_KEY, TYPES, quantize_file

REPO = Path(__file__).resolve().parents[2]
# Decode rel RMS against the F32 file in f32 precision, per type and product lowering, on 40
# frames of random codes. Measured on the tiny model: Q8_0 5.5e-4 (native) / 3.4e-4
# (dequantize), Q6_K 6.5e-4 / 5.5e-4. Bounds are about 3x those, so a broken quantizer (a wrong
# row order gives ~1.0) fails clearly while another ISA's summation order does not.
DECODE_BOUND = {("q8_0", "native"): 1.6e-3, ("q8_0", "dequantize"): 1.0e-3,
                ("q6_k", "native"): 2.0e-3, ("q6_k", "dequantize"): 1.6e-3}
# Dequantized weights against the originals, rel RMS: the types' own step sizes (measured
# 0.5 % and 1.8 % on Gaussian rows) with room.
WEIGHT_BOUND = {"q8_0": 0.01, "q6_k": 0.03}


@pytest.fixture(scope="module")
def quantized(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("quant")
    return {t: (quantize_file(tiny_model.f32_path, folder / f"tiny_{t}.gguf", t), folder / f"tiny_{t}.gguf")
            for t in TYPES}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


@pytest.mark.parametrize("qtype", sorted(TYPES))
def test_quantized_file_keeps_the_layout_and_records_the_choice(tiny_model, quantized, qtype):
    report, path = quantized[qtype]
    src = {t.name: t for t in GGUFReader(str(tiny_model.f32_path)).tensors}
    reader = GGUFReader(str(path))
    out = {t.name: t for t in reader.tensors}
    assert sorted(out) == sorted(src)  # same names
    want = GGMLQuantizationType[qtype.upper()]
    for name, t in out.items():
        assert list(t.shape) == list(src[name].shape), name  # same ne
        if name in report.quantized:
            assert t.tensor_type == want, name
            back = gguf.quants.dequantize(np.asarray(t.data), want).reshape(np.asarray(src[name].data).shape)
            err = _rel(back, np.asarray(src[name].data))
            assert err < WEIGHT_BOUND[qtype], f"{name}: dequantized rel RMS {err:.3e}"
        else:
            assert t.tensor_type == src[name].tensor_type, name
            assert np.array_equal(np.asarray(t.data), np.asarray(src[name].data)), name
    fields = reader.fields
    assert fields[TYPE_KEY].contents() == qtype.upper()
    kept = fields[KEPT_KEY].contents() if KEPT_KEY in fields else []
    assert kept == report.kept_for_block_size
    block = binding.block_size(TYPES[qtype])
    assert all(int(out[n].shape[0]) % block for n in kept)  # kept only where the block does not divide
    assert report.quantized, "nothing quantized"
    print(f"{qtype}: {len(report.quantized)} quantized, {len(kept)} kept for the block size; "
          f"{report.bytes_in} -> {report.bytes_out} bytes")


def test_ggml_quantizer_agrees_with_an_independent_dequantizer():
    """Blocks written by ggml_quantize_chunk, read back by gguf-py's numpy code and by ggml's own
    dequantizing copy: the same floats, bit for bit."""
    from pyggml_codec.backend import runtime
    from pyggml_codec.backend.ggml_graph import Graph
    from pyggml_codec.graphs import ops

    rows = np.random.default_rng(3).standard_normal((8, 512)).astype(np.float32)
    for qtype, ggml_type in TYPES.items():
        blocks = binding.quantize_rows(rows, ggml_type)
        ref = gguf.quants.dequantize(blocks.reshape(8, -1), GGMLQuantizationType(ggml_type))
        backend = runtime.start_backend("cpu")
        graph = Graph(backend, 4 << 20)
        try:
            def build(g):
                w = binding.new_tensor(g.ctx, ggml_type, (512, 8))
                g.inputs.append((w, blocks))
                return {"y": binding.lib.ggml_cast(g.ctx, w, binding.TYPE_F32)}
            graph.build(build, ops.Builder(ctx=graph.ctx))
            got = graph.run()["y"]
        finally:
            graph.free()
            backend.free()
        print(f"{qtype}: max |ggml - gguf-py| {np.abs(got - ref).max()}, rel RMS to the input {_rel(ref, rows):.2e}")
        assert np.array_equal(got, ref)


@pytest.mark.parametrize("qtype", sorted(TYPES))
@pytest.mark.parametrize("mode", ["native", "dequantize"])
def test_decode_error_per_type(tiny_model, quantized, qtype, mode):
    codes = random_codes([64] + [32] * 9, 40, seed=5)
    with pyggml_codec.load(tiny_model.f32_path, "cpu", n_threads=2) as ref_codec:
        ref, f32_bytes = ref_codec.decode(codes), ref_codec.loaded_bytes
    with pyggml_codec.load(quantized[qtype][1], "cpu", n_threads=2, lowerings={"quantized": mode}) as codec:
        got, loaded = codec.decode(codes), codec.loaded_bytes
        assert codec.lowerings["quantized"] == qtype.upper() + ("-dequantized" if mode == "dequantize" else "")
    assert loaded < f32_bytes
    err = _rel(got, ref)
    print(f"{qtype} {mode}: decode rel RMS {err:.3e} (bound {DECODE_BOUND[(qtype, mode)]}), "
          f"weights {loaded} of {f32_bytes} bytes")
    assert err < DECODE_BOUND[(qtype, mode)]


def test_every_decode_path_runs_a_quantized_file(tiny_model, quantized):
    """One-shot, chunked, streamed and fused decodes of a Q8_0 file agree with each other as far
    as the quantized products allow. Max abs against the one-graph decode, measured on the tiny
    model: "dequantize" (F32 activations) 3.4e-7 chunked, 3.1e-7 streamed, 0 fused with the
    native kernels, 4.0e-7 / 3.4e-7 / 0 with the portable ones: bound 4e-6. "native" (ggml's
    8-bit activations): 3.1e-7 / 2.8e-7 / 0 with the native kernels, 1.04e-4 / 1.04e-4 / 0
    with the portable ones (PYGGML_CODEC_PORTABLE=1), where one activation's 8-bit rounding
    flips because chunking moved it by a float ulp (1e-2 was seen on the louder demo model):
    bound 1e-3, 10x the flip measured."""
    codes = random_codes([64] + [32] * 9, 24, seed=6)
    for mode, bound in (("dequantize", 4e-6), ("native", 1e-3)):
        with pyggml_codec.load(quantized["q8_0"][1], "cpu", n_threads=2, lowerings={"quantized": mode}) as c:
            c.decode_chunk_frames = None
            one = c.decode(codes)
            c.decode_chunk_frames = 8
            chunked = c.decode(codes)
            fused = c.decode(codes, decode_path="fused")
            with c.stream_decoder() as sd:
                streamed = np.concatenate([sd.push(codes[:, i:i + 3]) for i in range(0, 24, 3)])
        diffs = {k: float(np.abs(v - one).max()) for k, v in
                 (("chunked", chunked), ("fused", fused), ("streamed", streamed))}
        print(f"q8_0 {mode}: max abs against one graph {diffs} (bound {bound}; audio peak {np.abs(one).max():.3f})")
        assert max(diffs.values()) < bound


def test_encode_codes_on_a_quantized_file(tiny_model, quantized):
    x = signal(44100, seed=4)
    with pyggml_codec.load(tiny_model.f32_path, "cpu") as c:
        ref, margins = (r := c.encode_details(x)).codes, r.margins
    with pyggml_codec.load(quantized["q8_0"][1], "cpu", lowerings={"quantized": "dequantize"}) as c:
        got = c.encode(x)
    clear = margins > 0.05
    agree = float(np.mean((got == ref)[clear]))
    print(f"q8_0 encode: agreement on clear margins {agree:.4f} ({clear.sum()} of {clear.size}), "
          f"overall {np.mean(got == ref):.4f}")
    assert agree >= 0.95


def test_loader_refuses_a_quantized_vector_and_an_unknown_type(tiny_model, tmp_path):
    reader = GGUFReader(str(tiny_model.f32_path))
    from pyggml_codec.model.gguf_write import TensorData, copy_field, write_gguf

    def rewrite(path: Path, name: str, qtype: GGMLQuantizationType) -> Path:
        tensors = []
        for t in reader.tensors:
            data = np.asarray(t.data).reshape([int(n) for n in t.shape[::-1]])
            if t.name == name:
                block, size = gguf.GGML_QUANT_SIZES[qtype]
                raw = np.zeros(data.shape[:-1] + (data.shape[-1] // block * size,), np.uint8)
                tensors.append(TensorData(t.name, raw, qtype))
            else:
                tensors.append(TensorData(t.name, data, GGMLQuantizationType(t.tensor_type)))
        meta = [copy_field(reader, k) for k in reader.fields if not k.startswith("GGUF.") and k != "general.architecture"]
        return write_gguf(path, "fish-speech-codec", meta, tensors)

    wqkv = "quantizer.post_module.layers.0.attention.wqkv.weight"
    bad_type = rewrite(tmp_path / "q4_0.gguf", wqkv, GGMLQuantizationType.Q4_0)
    with pytest.raises(TensorError, match=rf"{wqkv} has unsupported Q4_0.*Q8_0, Q6_K, Q5_K, Q4_K"):
        pyggml_codec.load(bad_type, "cpu")
    norm = "quantizer.post_module.layers.0.attention_norm.weight"  # a vector of 64: blocks divide it
    bad_role = rewrite(tmp_path / "norm.gguf", norm, GGMLQuantizationType.Q8_0)
    with pytest.raises(TensorError, match=rf"{norm} is Q8_0; quantized types are accepted for the transformer"):
        pyggml_codec.load(bad_role, "cpu")


def test_truncated_quantized_file_is_refused(quantized, tmp_path):
    data = quantized["q8_0"][1].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelFileError, match="needs bytes"):
        pyggml_codec.load(cut, "cpu")


def test_s2cpp_on_a_quantized_file_says_parity_is_not_established(quantized):
    with pytest.warns(RuntimeWarning, match="parity with the C\\+\\+ engine is not established"):
        pyggml_codec.load(quantized["q8_0"][1], "cpu", precision="s2cpp").close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyggml_codec.load(quantized["q8_0"][1], "cpu").close()  # f32 precision: no warning


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyggml_codec", *argv], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_cli_quantize_round_trip_and_errors(tiny_model, quantized, tmp_path):
    out = tmp_path / "q.gguf"
    done = _cli("quantize", str(tiny_model.f16_path), str(out), "--type", "Q6_K")
    assert done.returncode == 0, done.stderr
    assert "kept as stored, rows not a multiple of the Q6_K block" in done.stdout
    info = _cli("info", str(out), "--json")
    assert '"quantization": "Q6_K"' in info.stdout and '"Q6_K": ' in info.stdout
    cases = [  # (argv, message, exit status: 2 for a usage error)
        (["quantize", str(tiny_model.f32_path), str(tmp_path / "x.gguf"), "--type", "q3_z"], "unknown quantization type 'q3_z'", 2),
        (["quantize", str(tiny_model.f32_path), str(tmp_path / "x.gguf"), "--type", "q4_k"], "Q4_K was measured and rejected", 2),
        (["quantize", str(quantized["q8_0"][1]), str(tmp_path / "y.gguf")], "already quantized", 1),
        (["quantize", str(tiny_model.f32_path), str(out)], "exists (use --force", 1),
        (["quantize", str(tmp_path / "missing.gguf"), str(tmp_path / "z.gguf")], "no such model file", 1),
    ]
    for argv, message, status in cases:
        r = _cli(*argv)
        assert r.returncode == status and message in r.stderr, (argv, r.returncode, r.stderr)
    kept = _cli("quantize", str(tiny_model.f32_path), str(tmp_path / "k.gguf"), "--keep", "quantizer.post_module.*")
    assert kept.returncode == 0 and "kept as stored (--keep): quantizer.post_module.layers.0" in kept.stdout


def test_merged_file_keeps_its_language_model_tensors(tiny_model, tmp_path):
    """A merged fish-speech file: the codec's matrices (under ``c.``) are quantized, every
    other tensor and key is copied unchanged, and the result loads."""
    from pyggml_codec.model.convert import write_merged_fixture

    merged = write_merged_fixture(tiny_model.f16_path, tmp_path / "merged.gguf")
    report = quantize_file(merged, tmp_path / "merged_q8.gguf", "q8_0")
    src = {t.name: t for t in GGUFReader(str(merged)).tensors}
    out_reader = GGUFReader(str(tmp_path / "merged_q8.gguf"))
    out = {t.name: t for t in out_reader.tensors}
    assert report.quantized and all(n.startswith("c.") for n in report.quantized)
    for name in ("token_embd.weight", "blk.0.attn_norm.weight"):
        assert out[name].tensor_type == src[name].tensor_type
        assert np.array_equal(np.asarray(out[name].data), np.asarray(src[name].data))
    assert out_reader.fields["general.architecture"].contents() == "fish-speech"
    assert out_reader.fields["fish-speech.block_count"].contents() == 1
    with pyggml_codec.load(tmp_path / "merged_q8.gguf", "cpu") as codec:
        assert codec.decode(random_codes([64] + [32] * 9, 4, seed=1)).shape == (4 * 2048,)
