"""The HTML pages of ``compare``, ``s2cpp-compare`` and ``bench-backends`` (``--report``).

A page must be self-contained (no http(s) URL, every image a data URI), hold the pictures it
promises, and mark the first stage past tolerance, the stage ``Report.first_failure`` names.
Without matplotlib, ``--report`` fails with the install line before any work and writes nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import pyggml_codec
from parity import random_codes, signal
from pyggml_codec.cli.diagnostics import register_cli
from pyggml_codec.errors import CodecError
from pyggml_codec.io import dumps
from pyggml_codec.diagnostics import report as page
from pyggml_codec.diagnostics.compare import compare

N_FRAMES = 9
NEEDS_MPL = "matplotlib (the [plot] extra) is not installed: pip install 'pyggml_codec[plot]'"


def _mpl() -> None:
    pytest.importorskip("matplotlib", reason=NEEDS_MPL)


def _run(*argv) -> int:
    parser = argparse.ArgumentParser(prog="pyggml-codec")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([str(a) for a in argv])
    return args.func(args)


def _images(html: str) -> list[str]:
    return re.findall(r'<img [^>]*src="([^"]*)"', html)


def assert_self_contained(html: str, n_images: int) -> None:
    assert not re.search(r"https?://", html), "the page refers to a URL"
    srcs = _images(html)
    assert len(srcs) == n_images, f"{len(srcs)} images, expected {n_images}"
    assert all(s.startswith("data:image/png;base64,") and len(s) > 2000 for s in srcs)
    assert not re.search(r"<(script|link|iframe)\b", html)


def marked_first(html: str) -> list[str]:
    """The stages the page marks as first divergent (verdict attribute and table row)."""
    attr = re.findall(r'data-first-divergent="([^"]*)"', html)
    rows = re.findall(r'<tr class="fail first" data-stage="([^"]*)"', html)
    assert attr == rows, (attr, rows)
    return rows


@pytest.fixture(scope="module")
def decodes(tmp_path_factory, tiny_model):
    """Decode dumps of the same codes: f32, a copy with dec.upsample1 perturbed, and s2cpp precision."""
    d = tmp_path_factory.mktemp("report")
    with pyggml_codec.load(tiny_model.f16_path, backend="cpu", precision="f32") as codec:
        codes = random_codes(codec.config.quantizer.codebook_sizes, N_FRAMES, seed=3)
        codec.dump_decode(codes, d / "f32.npz")
    with pyggml_codec.load(tiny_model.f16_path, backend="cpu", precision="s2cpp") as codec:
        codec.dump_decode(codes, d / "s2cpp.npz")
    ours = dumps.load_dump(d / "f32.npz")
    bad = {k: v.copy() for k, v in ours.stages.items()}
    x = bad["dec.upsample1"]
    rng = np.random.default_rng(0)
    bad["dec.upsample1"] = x + 3e-3 * np.sqrt(np.mean(x**2)) * rng.standard_normal(x.shape).astype(np.float32)
    dumps.save_dump(d / "perturbed.npz", bad, ours.meta)
    return d


def test_compare_report_marks_the_perturbed_stage(decodes, tmp_path, capsys):
    _mpl()
    out = tmp_path / "sub" / "report.html"
    out.parent.mkdir()
    assert _run("compare", decodes / "f32.npz", decodes / "perturbed.npz", "--report", out) == 1
    assert "first stage past tolerance: dec.upsample1" in capsys.readouterr().out
    html = out.read_text()
    assert_self_contained(html, 3)  # stage errors, waveforms, log-mel spectrograms
    assert marked_first(html) == ["dec.upsample1"]
    assert "Waveforms" in html and "Log-mel spectrograms" in html
    assert list(tmp_path.rglob("*.tmp*")) == []


def test_compare_report_first_divergent_stage_f32_vs_s2cpp(decodes, tmp_path):
    """Bit for bit, the first stage marked is the first whose arrays are not identical."""
    _mpl()
    a, b = dumps.load_dump(decodes / "f32.npz"), dumps.load_dump(decodes / "s2cpp.npz")
    expected = next(n for n in a.stages if not np.array_equal(a.stages[n], b.stages[n]))
    assert expected != "codes"
    report = compare(decodes / "f32.npz", decodes / "s2cpp.npz", {"rel_rms": 0.0, "max_abs": 0.0})
    html = page.compare_page(report, decodes / "f32.npz", decodes / "s2cpp.npz")
    assert marked_first(html) == [expected]
    assert page.first_divergent_index(report) == list(a.stages).index(expected)
    assert_self_contained(html, 3)
    same = compare(decodes / "f32.npz", decodes / "f32.npz")
    html = page.compare_page(same, decodes / "f32.npz", decodes / "f32.npz")
    assert marked_first(html) == [] and "The audio of A and B is identical" in html


def test_compare_report_on_audio_and_code_files(decodes, tmp_path):
    _mpl()
    wave = dumps.load_dump(decodes / "f32.npz").stages["audio"]
    sf.write(tmp_path / "a.wav", wave, 44100, subtype="FLOAT")
    sf.write(tmp_path / "b.wav", wave * 0.9, 44100, subtype="FLOAT")
    assert _run("compare", tmp_path / "a.wav", tmp_path / "b.wav", "--report", tmp_path / "audio.html") == 1
    html = (tmp_path / "audio.html").read_text()
    assert_self_contained(html, 3)
    assert marked_first(html) == ["audio"]
    codes = random_codes([16] * 4, 12, seed=0).astype(np.int32)
    other = codes.copy()
    other[2, 5] += 1
    np.save(tmp_path / "a.npy", codes)
    np.save(tmp_path / "b.npy", other)
    assert _run("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--report", tmp_path / "codes.html") == 1
    html = (tmp_path / "codes.html").read_text()
    assert_self_contained(html, 2)  # stage errors and per-codebook agreement; no audio
    assert marked_first(html) == ["codes"] and "no waveform" in html


def test_mel_filterbank_puts_a_tone_in_its_band():
    rate, n_fft, n_mels = 44100, 2048, 80
    fb = page.mel_filterbank(rate, n_fft, n_mels)
    assert fb.shape == (n_mels, n_fft // 2 + 1) and (fb >= 0).all()
    centres = page.mel_to_hz(np.linspace(page.hz_to_mel(0), page.hz_to_mel(rate / 2), n_mels + 2))[1:-1]
    np.testing.assert_allclose(page.mel_to_hz(page.hz_to_mel(centres)), centres, rtol=1e-12)
    for f in (300.0, 1000.0, 5000.0):
        x = np.sin(2 * np.pi * f * np.arange(rate) / rate)
        band = int(np.argmax(page.log_mel(x, rate, n_fft=n_fft, n_mels=n_mels).mean(axis=1)))
        assert abs(centres[band] - f) <= 0.06 * f + 30, (f, centres[band])


def test_s2cpp_page_marks_each_direction(tmp_path):
    _mpl()
    rng = np.random.default_rng(1)
    ref = {"codes": rng.integers(0, 8, (2, 6)), "x": rng.standard_normal((4, 32)).astype(np.float32),
           "y": rng.standard_normal((4, 64)).astype(np.float32)}
    ours = {**ref, "y": ref["y"] + np.float32(1e-6)}
    reports = {"decode": compare(ref, ours, {"rel_rms": 0.0, "max_abs": 0.0}),
               "encode": compare(ref, dict(ref), {"rel_rms": 0.0, "max_abs": 0.0})}
    html = page.s2cpp_page(reports, {"ISA": "avx2"})
    assert_self_contained(html, 2)
    assert marked_first(html) == ["y"]
    assert html.count("OK: 3 stage(s) within tolerance") == 1


def test_bench_report_through_the_cli(tiny_model, tmp_path):
    _mpl()
    out = tmp_path / "bench.html"
    assert _run("bench-backends", "-m", tiny_model.f32_path, "--seconds", "0.1", "--repeats", "1",
                "--threads", "1", "--report", out) == 0
    html = out.read_text()
    assert_self_contained(html, 2)  # timing bars, parity against the CPU
    assert "cpu" in html and "Parity against the CPU" in html


def test_bench_page_shows_a_failed_backend(tiny_model):
    _mpl()
    from pyggml_codec.diagnostics.bench import BackendRow, bench_backends

    result = bench_backends(tiny_model.f32_path, seconds=0.1, repeats=1, n_threads=1, backends=["cpu"])
    result.rows.append(BackendRow("vulkan", error="no device"))
    html = page.bench_page(result)
    assert_self_contained(html, 2)
    assert "vulkan: FAILED: no device" in html


# --------------------------------------------------------------------------- without matplotlib


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError


def test_missing_matplotlib_is_a_clear_error(no_matplotlib):
    with pytest.raises(page.PlotExtraMissing, match=re.escape("pip install 'pyggml_codec[plot]'")) as exc:
        page.require_plotting()
    assert isinstance(exc.value, CodecError)
    with pytest.raises(page.PlotExtraMissing):
        page.stage_error_figure(compare({"x": np.ones(3)}, {"x": np.ones(3)}))


def test_missing_matplotlib_fails_before_work_and_writes_nothing(no_matplotlib, decodes, tiny_model, tmp_path,
                                                                monkeypatch, capsys):
    from pyggml_codec.diagnostics import bench, s2cpp

    def never(*_, **__):
        raise AssertionError("the long work started")

    monkeypatch.setattr(bench, "bench_backends", never)
    monkeypatch.setattr(s2cpp, "check_model_for_s2cpp", never)
    monkeypatch.setattr("pyggml_codec.cli.diagnostics.compare", never)
    out = tmp_path / "r.html"
    for argv in (["compare", decodes / "f32.npz", decodes / "perturbed.npz"],
                 ["bench-backends", "-m", tiny_model.f32_path],
                 ["s2cpp-compare", tmp_path, "-m", tiny_model.f16_path]):
        assert _run(*argv, "--report", out) == 1
        err = capsys.readouterr().err
        assert err.startswith("pyggml-codec: error: --report needs matplotlib") and err.count("\n") == 1
        assert "pip install 'pyggml_codec[plot]'" in err
        assert not out.exists() and list(tmp_path.iterdir()) == []


def test_no_matplotlib_at_import():
    import subprocess

    code = ("import sys, pyggml_codec, pyggml_codec.diagnostics.report, pyggml_codec.cli.main, pyggml_codec.cli.diagnostics;"
            "print(any(m.startswith('matplotlib') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_s2cpp_compare_report_through_the_cli(tiny_model, tmp_path, monkeypatch, capsys):
    """The command's page, with the C++ engine replaced by this library at f32 precision: each
    direction's first divergent stage is the first whose arrays differ from the s2cpp run's."""
    _mpl()
    from pyggml_codec.diagnostics import s2cpp

    seen = {}
    with pyggml_codec.load(tiny_model.f16_path, backend="cpu", precision="f32", n_threads=1) as f32:
        def fake_harness(exe, kind, model, data, threads=1, timeout=0):
            seen[kind] = s2cpp.our_stages(f32, kind, data), np.array(data)
            return dumps.Dump(seen[kind][0], {"producer": "f32 stand-in"})

        monkeypatch.setattr(s2cpp, "build_harness", lambda *a, **k: tmp_path / "s2cpp_dump")
        monkeypatch.setattr(s2cpp, "harness_info", lambda exe: {"ggml_commit": "test", "avx2": True, "fma": True,
                                                                 "f16c": True, "llamafile": False})
        monkeypatch.setattr(s2cpp, "run_harness", fake_harness)
        out = tmp_path / "s2.html"
        assert _run("s2cpp-compare", tmp_path, "-m", tiny_model.f16_path, "--frames", "6", "--threads", "1",
                    "--report", out) == 1
    printed = capsys.readouterr().out
    expected = []
    with pyggml_codec.load(tiny_model.f16_path, backend="cpu", precision="s2cpp", n_threads=1) as ours:
        for kind in ("decode", "encode"):
            ref, data = seen[kind]
            mine = s2cpp.our_stages(ours, kind, data)
            expected.append(next(n for n in ref if not np.array_equal(ref[n], mine[n])))
    html = out.read_text()
    assert_self_contained(html, 2)
    assert marked_first(html) == expected
    assert all(f"first stage past tolerance: {n}" in printed for n in expected)
