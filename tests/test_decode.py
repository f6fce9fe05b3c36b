"""Decode parity against the upstream PyTorch codec, and the decode paths' contracts."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import oracle
import pyggml_codec
from parity import random_codes, report
from pyggml_codec import InputError

# f32 mode: F32 arithmetic throughout, its residual convs by Winograd F(4,7) (about 1e-5 of a conv's
# largest output per conv). Measured rel RMS against PyTorch: tiny model 3.24e-7 to 3.35e-7 (1 and 10 s,
# native and portable kernels), full size 6.9e-7 (1 s); the bounds sit about 7-9x above.
F32_REL_RMS = 3e-6
F32_FULL_REL_RMS = 5e-6
# s2cpp mode rounds conv inputs and weights to F16 (~5e-4 relative per value).
S2CPP_REL_RMS = 2e-3


def _sizes(codec):
    return codec.config.quantizer.codebook_sizes


@pytest.mark.parametrize("seconds", [1, 10])
@pytest.mark.parametrize("dtype,precision,tol", [("f32", "f32", F32_REL_RMS), ("f16", "s2cpp", S2CPP_REL_RMS)])
def test_decode_matches_oracle_tiny(tiny_model, seconds, dtype, precision, tol):
    n_frames = int(np.ceil(seconds * 44100 / 2048))
    with pyggml_codec.load(tiny_model.path(dtype), backend="cpu", precision=precision) as codec:
        codes = random_codes(_sizes(codec), n_frames, seed=seconds)
        got = codec.decode(codes)
    want = oracle.decode(tiny_model.model, codes)
    assert got.shape == (n_frames * 2048,)
    rel, _ = report(f"tiny decode {seconds}s {dtype}/{precision}", got, want)
    assert rel <= tol


@pytest.mark.slow
@pytest.mark.parametrize("dtype,precision,tol", [("f32", "f32", F32_FULL_REL_RMS), ("f16", "s2cpp", S2CPP_REL_RMS)])
def test_decode_matches_oracle_full(full_model, dtype, precision, tol):
    with pyggml_codec.load(full_model.path(dtype), backend="cpu", precision=precision, n_threads=2) as codec:
        codes = random_codes(_sizes(codec), 22, seed=1)
        got = codec.decode(codes)
    want = oracle.decode(full_model.model, codes)
    rel, _ = report(f"full decode 1s {dtype}/{precision}", got, want)
    assert rel <= tol


@pytest.fixture(scope="module")
def codec(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu") as c:
        yield c


def test_fused_equals_split(codec):
    codes = random_codes(_sizes(codec), 23, seed=3)
    split = codec.decode(codes, decode_path="split")
    fused = codec.decode(codes, decode_path="fused")
    print(f"fused vs split max abs {np.max(np.abs(split - fused)):.3e}")
    np.testing.assert_array_equal(split, fused)


def test_graph_reused_for_repeated_frame_count(codec):
    codec.clear_cache()
    codes = random_codes(_sizes(codec), 12, seed=4)
    codec.decode(codes)
    graphs = dict(codec.engine.cached_graphs())
    again = codec.decode(random_codes(_sizes(codec), 12, seed=5))
    assert dict(codec.engine.cached_graphs()) == graphs
    assert again.shape == (12 * 2048,)


def test_fused_failure_is_remembered(tiny_model, monkeypatch):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", decode_path="fused") as codec:
        codes = random_codes(_sizes(codec), 9, seed=6)
        expected = codec.decode(codes, decode_path="split")
        calls = []

        def failing(codes_, stages):
            calls.append(codes_.shape[1])
            raise pyggml_codec.GraphError("injected failure")

        monkeypatch.setattr(codec.engine, "_decode_fused", failing)
        first = codec.decode(codes)
        codec.clear_cache()  # the memory of the failure survives clearing the cache
        second = codec.decode(codes)
        assert calls == [9]
        assert codec.failed_fused_frames == {9}
        np.testing.assert_array_equal(first, expected)
        np.testing.assert_array_equal(second, expected)
        other = random_codes(_sizes(codec), 10, seed=7)
        codec.decode(other)
        assert calls == [9, 10]


def test_mask_choice(tiny_model, codec):
    """The masked attention forms: window < T gets the sliding-window mask; T <= window uses
    diag_mask_inf. The CPU's default ("fused") takes no mask."""
    window = codec.config.rvq_transformer.window
    codec.clear_cache()
    codec.lowerings.clear()
    codec.decode(random_codes(_sizes(codec), window, seed=8))
    assert codec.lowerings["quantizer.post_module.mask"] == "fused-window"
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings={"attention": "blocked"}) as masked:
        masked.decode(random_codes(_sizes(masked), window, seed=8))
        assert masked.lowerings["quantizer.post_module.mask"] == "diag_mask_inf"
        masked.decode(random_codes(_sizes(masked), window + 5, seed=9))  # lowerings keep every choice used
        assert masked.lowerings["quantizer.post_module.mask"] == "diag_mask_inf+window-mask"
        masked.clear_cache()
        masked.lowerings.clear()
        masked.decode(random_codes(_sizes(masked), window + 5, seed=9))
        assert masked.lowerings["quantizer.post_module.mask"] == "window-mask"


def test_clamp_warns_with_counts(codec):
    codes = random_codes(_sizes(codec), 5, seed=10)
    clean = codec.decode(codes)
    bad = codes.copy()
    bad[0, 0] = -3
    bad[2, 1] = 10_000
    bad[2, 2] = 32
    with pytest.warns(RuntimeWarning, match=r"codebook 0: 1, codebook 2: 2"):
        out = codec.decode(bad)
    fixed = codes.copy()
    fixed[0, 0], fixed[2, 1], fixed[2, 2] = 0, 31, 31
    np.testing.assert_array_equal(out, codec.decode(fixed))
    assert not np.array_equal(out, clean)
    with pytest.raises(InputError, match="out of range"):
        codec.decode(bad, on_invalid_codes="raise")


def test_codes_layouts_and_dtypes(codec):
    codes = random_codes(_sizes(codec), 4, seed=11)
    ref = codec.decode(codes)
    for variant in (codes.astype(np.int32), codes.astype(np.uint16), codes[None]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(codec.decode(variant), ref)


@pytest.mark.parametrize(
    "bad,match",
    [
        (np.zeros((9, 4), np.int64), "shape"),
        (np.zeros((10,), np.int64), "shape"),
        (np.zeros((2, 10, 4), np.int64), "shape"),
        (np.zeros((10, 0), np.int64), "empty"),
        (np.zeros((10, 4), np.float32), "integers"),
        (np.zeros((10, 4), bool), "integers"),
    ],
)
def test_bad_codes_rejected(codec, bad, match):
    with pytest.raises(InputError, match=match):
        codec.decode(bad)


def test_decode_only_load(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu") as full, \
            pyggml_codec.load(tiny_model.f32_path, backend="cpu", parts="decode") as dec:
        print(f"loaded bytes: all {full.loaded_bytes}, decode {dec.loaded_bytes}")
        assert dec.loaded_bytes < full.loaded_bytes
        assert "encoder.block.0.conv.weight" not in dec.engine.model.weights
        assert "quantizer.pre_module.norm.weight" not in dec.engine.model.weights
        assert "decoder.model.0.conv.weight" in dec.engine.model.weights
        codes = random_codes(_sizes(dec), 6, seed=12)
        np.testing.assert_array_equal(dec.decode(codes), full.decode(codes))
        with pytest.raises(InputError, match="parts='decode'"):
            dec.encode(np.zeros(4096, np.float32))
