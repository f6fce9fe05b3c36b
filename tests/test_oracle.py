"""Self-checks of the reference itself, so parity tests can trust it."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import oracle

SR = 44100


def _noise(n: int, seed: int = 0) -> np.ndarray:
    return (0.3 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def test_stubs_do_not_leak():
    oracle.upstream()
    for name in ("hydra", "librosa", "omegaconf", "audiotools"):
        assert name not in sys.modules or getattr(sys.modules[name], "__file__", None), name
    import soundfile

    assert hasattr(soundfile, "read"), "the real soundfile must survive the shim"


def test_same_seed_same_weights_other_seed_differs():
    a, b, c = (oracle.export_state_dict(oracle.build_model(oracle.TINY, s)) for s in (3, 3, 4))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["encoder.block.0.conv.bias"], c["encoder.block.0.conv.bias"])


def test_meta_build_equals_cpu_build():
    a = oracle.export_state_dict(oracle.build_model(oracle.TINY, 5, meta=True))
    b = oracle.export_state_dict(oracle.build_model(oracle.TINY, 5, meta=False))
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_rope_table_is_float32_unless_asked(tiny_model):
    pre = tiny_model.model.quantizer.pre_module
    assert pre.freqs_cis.dtype == torch.float32
    bf16 = oracle.build_model(oracle.TINY, 0, rope_f32=False).quantizer.pre_module.freqs_cis
    assert bf16.dtype == torch.bfloat16
    assert float((pre.freqs_cis - bf16.float()).abs().max()) > 0


@pytest.mark.parametrize("n", [4096, SR, 6 * SR + 123])
def test_codes_margins_and_padding(tiny_model, n):
    audio, model = _noise(n), tiny_model.model
    codes = oracle.encode(model, audio)
    t = -(-n // 2048)
    assert codes.shape == (10, t) and codes.dtype == np.int64
    margins, loop_codes = oracle.margins_and_codes(model, audio)
    assert np.array_equal(loop_codes, codes), "re-run residual loop must equal DAC.encode"
    assert margins.shape == (10, t) and (margins >= 0).all()
    assert np.array_equal(oracle.encode_padded(model, audio, 2048), codes)
    cpp = oracle.encode_padded(model, audio, 512)
    differs = np.flatnonzero((cpp != codes).any(axis=0))
    print(f"n={n}: frames where 512- and 2048-padding codes differ: {differs.tolist()}")
    assert set(differs) <= {t - 1}, "padding can only change the last code frame"
    if (-(-n // 512)) % 4:  # the 512-padded signal really is shorter: last frame must change
        assert differs.tolist() == [t - 1]


def test_decode_and_intermediates(tiny_model):
    audio, model, cfg = _noise(SR), tiny_model.model, oracle.TINY
    codes = oracle.encode(model, audio)
    wave = oracle.decode(model, codes)
    assert wave.shape == (codes.shape[1] * 2048,) and wave.dtype == np.float32
    assert 0.005 < float(wave.std()) and float(np.abs(wave).max()) < 0.99  # tanh not saturated
    lat = oracle.latent(model, audio)
    assert lat.shape == (cfg.latent_dim, codes.shape[1] * 4)
    pre = oracle.pre_module_output(model, audio)
    assert pre.shape == (cfg.quantizer_input_dim, codes.shape[1])
