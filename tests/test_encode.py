"""Encode parity against the upstream PyTorch codec (float32 RoPE tables), and encode's contracts."""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import pyggml_codec
from parity import code_agreement, rel_rms, report, signal
from pyggml_codec import InputError
from pyggml_codec.backend import binding

# Latent and pre_module output in f32 mode, rel RMS against PyTorch: tiny model 5.3e-7 to 6.5e-7 over
# the lengths and framings below (native and portable kernels), full size 8.9e-7 to 1.3e-6 (1 and
# 10 s); the decoded round trip 3.0e-7 to 3.1e-7. The bounds sit about 8-10x above.
F32_REL_RMS = 5e-6
F32_FULL_REL_RMS = 1e-5
ROUND_TRIP_REL_RMS = 3e-6
# s2cpp mode rounds every conv input to F16; ~1e-3 measured at tiny size.
S2CPP_REL_RMS = 5e-3
TIE = 1e-4  # codes are compared exactly where the oracle's top-2 cosine margin exceeds this
# s2cpp: F16 rounding moves the latent by ~8e-4 rel RMS, so scores move by ~1e-3; codes are
# compared where the margin exceeds that (99.5 % of the codes of the test signal). A ggml built for
# AVX512-FP16 also adds the F16 products in half precision: 1.1e-3 latent rel RMS (max abs 2.8e-3),
# and a code at a margin of 1.03e-3 moves; there codes are compared past twice that margin.
S2CPP_TIE = 2e-3 if binding.f16_dot_sums_in_half() else 1e-3

# (seconds, extra samples): 7 s exceeds the 512-latent-frame encoder window; 3.3 s + 1234
# samples is not a multiple of 2048 and makes ceil(n / 512) not a multiple of 4.
LENGTHS = [(1, 0), (7, 0), (10, 0), (3, 1234)]


def _n(seconds, extra):
    return seconds * 44100 + extra


@pytest.fixture(scope="module")
def f32_codec(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", precision="f32") as c:
        yield c


def _check(label, codec, model, x, pad_to, tol, tie=TIE):
    multiple = 2048 if pad_to == "code_frame" else 512
    result = codec.encode_stages(x, pad_to=pad_to)
    lat = oracle.latent(model, x, multiple)
    pre = oracle.pre_module_output(model, x, multiple)
    margins, want = oracle.margins_and_codes(model, x, multiple)
    r_lat, _ = report(f"{label} latent", result.stages["latent"], lat)
    r_pre, _ = report(f"{label} pre_module", result.stages["pre_module"].T, pre)
    clear, ties, overall = code_agreement(result.codes, want, margins, tie)
    print(f"{label} codes: {clear:.2%} equal where the margin > {tie}, {ties} near-ties, {overall:.2%} overall")
    assert result.codes.shape == (codec.config.n_codebooks, -(-x.shape[0] // 2048))
    return r_lat, r_pre, clear


@pytest.mark.parametrize("seconds,extra", LENGTHS)
@pytest.mark.parametrize("pad_to", ["code_frame", "frame_length"])
def test_encode_matches_oracle_tiny_f32(tiny_model, f32_codec, seconds, extra, pad_to):
    x = signal(_n(seconds, extra), seed=seconds)
    r_lat, r_pre, clear = _check(f"tiny {seconds}s+{extra} {pad_to} f32", f32_codec, tiny_model.model, x, pad_to,
                                 F32_REL_RMS)
    assert r_lat <= F32_REL_RMS and r_pre <= F32_REL_RMS
    assert clear == 1.0


def test_encode_matches_oracle_tiny_s2cpp(tiny_model):
    """s2cpp against the f32 oracle. Measured: latent 8.2e-4 and pre_module 8.4e-4 rel RMS
    (bound 5e-3); all 660 codes equal (smallest oracle margin 2.8e-4, 3 codes under 1e-3). With
    AVX512-FP16's half sums: 1.1e-3 and 1.3e-3, 658 of 660 equal (a code at margin 1.03e-3, and a
    later codebook of its frame). Every code whose margin exceeds S2CPP_TIE must be equal, but for
    those after a near-tie flip in the same frame."""
    x = signal(_n(3, 1234), seed=5)
    with pyggml_codec.load(tiny_model.f16_path, backend="cpu", precision="s2cpp") as codec:
        r_lat, r_pre, clear = _check("tiny s2cpp/F16", codec, tiny_model.model, x, "code_frame", S2CPP_REL_RMS,
                                     S2CPP_TIE)
    assert r_lat <= S2CPP_REL_RMS and r_pre <= S2CPP_REL_RMS
    assert clear == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("seconds", [1, 10])
def test_encode_matches_oracle_full(full_model, seconds):
    x = signal(_n(seconds, 0), seed=seconds)
    with pyggml_codec.load(full_model.f32_path, backend="cpu", precision="f32", n_threads=2) as codec:
        r_lat, r_pre, clear = _check(f"full {seconds}s f32", codec, full_model.model, x, "code_frame", F32_FULL_REL_RMS)
    assert r_lat <= F32_FULL_REL_RMS and r_pre <= F32_FULL_REL_RMS
    assert clear == 1.0


def test_padding_policies_differ_only_in_last_frame(f32_codec):
    x = signal(_n(3, 1234), seed=6)  # ceil(n/512) = 261, not a multiple of 4
    a = f32_codec.encode(x, pad_to="code_frame")
    b = f32_codec.encode(x, pad_to="frame_length")
    np.testing.assert_array_equal(a[:, :-1], b[:, :-1])
    assert not np.array_equal(a[:, -1], b[:, -1])


def test_round_trip_matches_oracle(tiny_model, f32_codec):
    x = signal(_n(2, 0), seed=7)
    got = f32_codec.decode(f32_codec.encode(x))
    want = oracle.decode(tiny_model.model, oracle.encode(tiny_model.model, x))
    rel, _ = report("tiny round trip", got, want)
    assert rel <= ROUND_TRIP_REL_RMS


def test_causality_prefix_codes(f32_codec):
    """A prefix's codes are the whole input's first codes. The two encodes multiply different
    column counts, so latents may differ by ~1e-7: only a near-tie (margin < 1e-4) may flip."""
    x = signal(_n(4, 0), seed=8)
    whole = f32_codec.encode_details(x)
    t = 20
    prefix = f32_codec.encode(x[: t * 2048])
    flips = prefix != whole.codes[:, :t]
    print(f"prefix of {t} frames: {int(flips.sum())} of {flips.size} codes differ (bound: near-ties only)")
    assert prefix.shape == whole.codes[:, :t].shape
    assert np.all(whole.margins[:, :t][flips] < 1e-4), "only near-ties may flip"


def test_margins_returned(f32_codec):
    x = signal(8192, seed=9)
    codes, margins = (r := f32_codec.encode_details(x)).codes, r.margins
    assert margins.shape == codes.shape and np.all(margins >= 0)


def test_host_vq_runs_on_one_blas_thread(f32_codec, monkeypatch):
    """The host VQ's numpy products run with OpenBLAS's process-wide count held at 1: a threaded
    product leaves its workers spinning on the cores the next compute needs. Counted at every
    stage's call, and the caller's count is back afterwards."""
    from pyggml_codec.backend import kernels
    from pyggml_codec.model import vq

    blas = kernels.BLAS
    if blas is None or blas.threading != "pthreads":
        pytest.skip(f"no process-wide OpenBLAS thread count here ({blas and blas.threading})")
    seen, original = [], vq.residual_quantize

    def counted(stages, z):
        seen.append(int(blas._get()))
        return original(stages, z)

    monkeypatch.setattr(vq, "residual_quantize", counted)
    before = int(blas._get())
    f32_codec.encode(signal(8192, seed=9))
    print(f"OpenBLAS threads: {before} before, {seen} during the host VQ, {int(blas._get())} after")
    assert seen == [1] and int(blas._get()) == before


def test_input_forms(f32_codec):
    x = signal(6000, seed=10)
    ref = f32_codec.encode(x)
    np.testing.assert_array_equal(f32_codec.encode(x.astype(np.float64)), ref)
    np.testing.assert_array_equal(f32_codec.encode(x[None, :]), ref)
    pcm = np.round(x * 32767).astype(np.int16)
    assert rel_rms(f32_codec.decode(f32_codec.encode(pcm)), f32_codec.decode(ref)) < 0.5
    stereo = np.stack([x, x])
    np.testing.assert_array_equal(f32_codec.encode(stereo, mix="mean"), ref)
    with pytest.raises(InputError, match="channels"):
        f32_codec.encode(stereo)


@pytest.mark.parametrize(
    "bad,kwargs,match",
    [
        (np.zeros(0, np.float32), {}, "empty"),
        (np.array([0.0, np.nan], np.float32), {}, "NaN"),
        (np.array([0.0, np.inf], np.float32), {}, "NaN or Inf"),
        (np.zeros(100, np.int32), {}, "dtype"),
        (np.zeros((1, 1, 100), np.float32), {}, "shape"),
        (np.zeros(100, np.float32), {"sample_rate": 16000}, "sample rate"),
    ],
)
def test_bad_audio_rejected(f32_codec, bad, kwargs, match):
    with pytest.raises(InputError, match=match):
        f32_codec.encode(bad, **kwargs)
