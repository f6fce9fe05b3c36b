"""Decode, encode and streaming on the GPU backend against the CPU backend, per precision.

Inputs are small (24-frame decodes, a 0.6 s encode on the tiny model) because a software
Vulkan driver is 100-400x slower than the CPU backend. Each test states its metric and
tolerance and prints what it measured.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyggml_codec
from parity import code_agreement, random_codes, rel_rms, report, signal

pytestmark = pytest.mark.gpu

FRAMES = 24
# Decode audio, relative RMS against the CPU backend, per precision (measured on lavapipe,
# README's Vulkan table). f32: both backends compute F32 products, so only the summation
# order differs: measured 4.8e-7, bound 5e-6. s2cpp: the same F16 roundings of conv inputs on
# both sides, then products whose accumulation differs: measured 2.1e-4, bound 2e-3.
DECODE_TOL = {"f32": 5e-6, "s2cpp": 2e-3}
# Encode latent and pre_module, relative RMS (same reasons): measured 5.9e-7 / 6.6e-7 in f32,
# 4.7e-4 / 6.1e-4 in s2cpp.
LATENT_TOL = {"f32": 5e-6, "s2cpp": 5e-3}


def _codes(n: int = FRAMES, seed: int = 8) -> np.ndarray:
    return random_codes((64,) + (32,) * 9, n, seed=seed)


@pytest.fixture(scope="module")
def cpu_codecs(gpu_backend, tiny_model):  # skips first where the backend is absent
    codecs = {p: pyggml_codec.load(tiny_model.path("f32" if p == "f32" else "f16"), backend="cpu", precision=p)
              for p in ("f32", "s2cpp")}
    yield codecs
    for c in codecs.values():
        c.close()


@pytest.fixture(scope="module")
def gpu_codecs(gpu_backend, tiny_model):
    codecs = {p: pyggml_codec.load(tiny_model.path("f32" if p == "f32" else "f16"), backend=gpu_backend,
                                   strict_backend=True, precision=p) for p in ("f32", "s2cpp")}
    yield codecs
    for c in codecs.values():
        c.close()


@pytest.mark.parametrize("precision", ["f32", "s2cpp"])
def test_decode_fused_and_split_match_the_cpu(cpu_codecs, gpu_codecs, precision):
    codes = _codes()
    want = cpu_codecs[precision].decode(codes)
    gpu = gpu_codecs[precision]
    assert gpu.plan.products == "f32", gpu.plan  # the session fixture started the device with F16 off
    fused = gpu.decode(codes, decode_path="fused")
    split = gpu.decode(codes, decode_path="split")
    assert ("fused", FRAMES) in gpu.engine.cached_graphs() and ("wave", FRAMES) in gpu.engine.cached_graphs()
    r_fused, _ = report(f"{gpu.device_name} {precision} fused decode vs CPU", fused, want)
    r_split, _ = report(f"{gpu.device_name} {precision} split decode vs CPU", split, want)
    assert r_fused <= DECODE_TOL[precision] and r_split <= DECODE_TOL[precision]
    # fused and split are the same ops in one graph or two: rounding-level apart at most
    r_fs, _ = report(f"{gpu.device_name} {precision} fused vs split", fused, split)
    assert r_fs <= DECODE_TOL[precision]


@pytest.mark.parametrize("precision", ["f32", "s2cpp"])
def test_encode_matches_the_cpu(cpu_codecs, gpu_codecs, precision):
    x = signal(int(0.6 * 44100), seed=9)  # 13 code frames
    want = cpu_codecs[precision].encode_stages(x)
    got = gpu_codecs[precision].encode_stages(x)
    r_lat, _ = report(f"{precision} encode latent vs CPU", got.stages["latent"], want.stages["latent"])
    r_pre, _ = report(f"{precision} encode pre_module vs CPU", got.stages["pre_module"], want.stages["pre_module"])
    clear, ties, overall = code_agreement(got.codes, want.codes, want.margins)
    print(f"{precision} codes: {100 * clear:.2f} % equal where the CPU margin > 1e-4 ({ties} near-ties), "
          f"{100 * overall:.2f} % overall")
    assert r_lat <= LATENT_TOL[precision] and r_pre <= LATENT_TOL[precision]
    assert clear == 1.0  # a code may only flip where the CPU's own top-2 margin is a near-tie
    codes_again = gpu_codecs[precision].encode(x)  # the cached (non-stage) graphs
    np.testing.assert_array_equal(codes_again, got.codes)


def test_repeated_stage_encodes_stay_stable(gpu_codecs):
    """Repeated encode(return_stages=True) calls give identical results and keep the process
    alive: off the CPU the stage graphs are cached, not built and freed per call (freeing
    compute buffers per call aborted lavapipe processes before ``Backend.release`` parked them)."""
    x = signal(int(0.3 * 44100), seed=4)
    first = gpu_codecs["f32"].encode_stages(x)
    codec = gpu_codecs["f32"]
    for _ in range(4):
        again = codec.encode_stages(x)
        np.testing.assert_array_equal(again.codes, first.codes)
        np.testing.assert_array_equal(again.stages["latent"], first.stages["latent"])
    assert any(k[0] == "enc" and k[-1] == "stages" for k in codec.engine.cached_graphs())
    audio, stages = codec.decode_stages(_codes(12))
    again, _ = codec.decode_stages(_codes(12))
    np.testing.assert_array_equal(again, audio)
    assert audio.shape == (12 * codec.config.samples_per_frame,) and "dec.latent" in stages


def test_streaming_matches_one_shot_on_the_device(gpu_codecs):
    """Streamed decode (carried state, chunks of 5, 7 and 12 frames) against one decode of
    the same 24 frames on the same device: max abs <= 2.5e-6 (measured 2.4e-7 on lavapipe; the
    CPU's own stream is within 2e-7 of its one-shot; the device's chunked graphs round in
    another order)."""
    codec = gpu_codecs["f32"]
    codes = _codes()
    want = codec.decode(codes)
    with codec.stream_decoder() as sd:
        pieces = [sd.push(codes[:, a:b]) for a, b in ((0, 5), (5, 12), (12, 24))]
    got = np.concatenate(pieces)
    _, err = report(f"{codec.device_name} stream (5+7+12) vs one-shot", got, want)
    assert got.shape == want.shape and err <= 2.5e-6


def test_bad_backend_requests_raise_clearly(gpu_backend, tiny_model):
    from pyggml_codec import BackendError

    with pytest.raises(BackendError, match=f"{gpu_backend} device 7 does not exist"):
        pyggml_codec.load(tiny_model.f32_path, backend=gpu_backend, device=7, strict_backend=True)
    with pytest.raises(ValueError, match="device must be an int >= 0"):
        pyggml_codec.load(tiny_model.f32_path, backend=gpu_backend, device=-1)
    lacking = [b for b in ("cuda", "metal", "vulkan") if b not in pyggml_codec.available_backends()]
    for name in lacking:
        with pytest.raises(BackendError, match=f"backend '{name}' unavailable: this ggml build has no {name}"):
            pyggml_codec.load(tiny_model.f32_path, backend=name, strict_backend=True)
    with pytest.warns(RuntimeWarning, match=f"{gpu_backend} device 7 does not exist"):
        with pyggml_codec.load(tiny_model.f32_path, backend=gpu_backend, device=7) as c:
            assert c.backend_name == "cpu" and "does not exist" in c.fallback_reason


def test_a_device_that_fails_to_start_is_an_error_not_an_abort(gpu_backend, tiny_model):
    """GGML_VK_VISIBLE_DEVICES naming a device that does not exist makes ggml-vulkan's start
    fail: the load raises a BackendError that says why, and the process lives on."""
    import child

    if gpu_backend != "vulkan":
        pytest.skip("GGML_VK_VISIBLE_DEVICES is ggml-vulkan's")
    script = """
import os, sys
os.environ["GGML_VK_VISIBLE_DEVICES"] = "7"
import pyggml_codec
def strict():
    pyggml_codec.load(sys.argv[1], backend="vulkan", strict_backend=True)
case("strict", strict)
"""
    r = child.run_cases(script, str(tiny_model.f32_path))
    print(r)
    assert r["strict"]["raised"] == "BackendError"
    assert "found no usable vulkan device (GGML_VK_VISIBLE_DEVICES=7)" in r["strict"]["message"]
