"""Errors a user meets on the command line: one message per case across commands, no output
where the request cannot be met (a file-like name for a directory run, a missing folder), the
input file named in errors about its contents, usage errors exiting 2, truncated audio refused
unless allowed, and a codec-only file named as such by ``convert --extract``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pyggml_codec.cli import main as cli_main


def main(*args) -> int:
    try:
        return cli_main.main([str(a) for a in args])
    except SystemExit as exc:  # argparse usage errors
        return exc.code


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("pyggml-codec: error: "), err
    return err[-1]


@pytest.fixture(scope="module")
def tone(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("errors") / "tone.wav"
    sf.write(path, 0.3 * np.sin(np.arange(12000) / 7), 44100, subtype="FLOAT")
    return path


def test_a_directory_as_the_model_gets_one_message(tiny_model, tone, tmp_path, capsys):
    lines = []
    for argv in (["info", tmp_path], ["encode", tone, "-m", tmp_path, "-o", tmp_path / "x.npz"],
                 ["quantize", tmp_path, tmp_path / "q.gguf"], ["bench-backends", "-m", tmp_path]):
        assert main(*argv) == 1
        lines.append(error_line(capsys))
    assert len(set(lines)) == 1 and lines[0] == f"pyggml-codec: error: {tmp_path}: the model is a directory, not a GGUF file"


@pytest.mark.parametrize("command, name", [("encode", "single.npz"), ("encode", "single.s2voice"),
                                           ("decode", "single.wav"), ("decode", "single.flac")])
def test_a_directory_run_refuses_a_file_name_as_output(tiny_model, tone, tmp_path, capsys, command, name):
    src = tmp_path / "in"
    src.mkdir()
    if command == "encode":
        (src / "a.wav").write_bytes(tone.read_bytes())
    else:
        assert main("encode", tone, "-m", tiny_model.f32_path, "-o", src / "a.npz", "-q") == 0
    assert main(command, src, "-m", tiny_model.f32_path, "-o", tmp_path / name) == 2
    assert "directory" in error_line(capsys) and not (tmp_path / name).exists()


@pytest.mark.parametrize("argv", [
    ["encode", "{tone}", "-m", "{model}", "-o", "{missing}/x.npz"],
    ["roundtrip", "{tone}", "-m", "{model}", "-o", "{missing}/x.wav"],
    ["encode", "{dir}", "-m", "{model}", "-o", "{missing}/codes"],
    ["quantize", "{model}", "{missing}/q.gguf"],
    ["convert", "{model}", "{missing}/c.gguf", "--extract"],
])
def test_outputs_are_never_written_into_missing_folders(tiny_model, tone, tmp_path, capsys, argv):
    missing = tmp_path / "nonexistent_dir"
    values = {"tone": tone, "model": tiny_model.f32_path, "missing": missing, "dir": tone.parent}
    assert main(*[a.format(**values) for a in argv]) == 1
    assert error_line(capsys).startswith(f"pyggml-codec: error: {missing}: no such directory")
    assert not missing.exists()


def test_errors_about_contents_name_their_file(tiny_model, tmp_path, capsys):
    nan = np.zeros(44100, np.float32)
    nan[::2] = np.nan
    sf.write(tmp_path / "nan.wav", nan, 44100, subtype="FLOAT")
    assert main("encode", tmp_path / "nan.wav", "-m", tiny_model.f32_path, "-o", tmp_path / "x.npz") == 1
    assert error_line(capsys) == f"pyggml-codec: error: {tmp_path / 'nan.wav'}: audio contains 22050 NaN or Inf samples"
    assert main("roundtrip", tmp_path / "nan.wav", "-m", tiny_model.f32_path, "-o", tmp_path / "x.wav") == 1
    assert f"{tmp_path / 'nan.wav'}: audio contains" in error_line(capsys)
    np.save(tmp_path / "empty.npy", np.zeros((10, 0), np.int64))
    assert main("decode", tmp_path / "empty.npy", "-m", tiny_model.f32_path, "-o", tmp_path / "x.wav") == 1
    assert error_line(capsys) == f"pyggml-codec: error: {tmp_path / 'empty.npy'}: codes are empty (T = 0)"
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "x.wav").exists()


@pytest.mark.parametrize("qtype, message", [("q3", "unknown quantization type 'q3'"), ("q4_k", "measured and rejected")])
def test_quantize_type_is_a_usage_error(tiny_model, tmp_path, capsys, qtype, message):
    assert main("quantize", tiny_model.f32_path, tmp_path / "q.gguf", "--type", qtype) == 2
    assert message in error_line(capsys) and not (tmp_path / "q.gguf").exists()


def test_a_truncated_wav_is_refused_unless_allowed(tiny_model, tone, tmp_path, capsys):
    cut = tmp_path / "cut.wav"
    cut.write_bytes(tone.read_bytes()[:1000])
    assert main("encode", cut, "-m", tiny_model.f32_path, "-o", tmp_path / "x.npz") == 1
    line = error_line(capsys)
    assert f"{cut}: truncated: the header declares 0.27 s" in line and "--allow-truncated" in line
    assert not (tmp_path / "x.npz").exists()
    assert main("encode", cut, "-m", tiny_model.f32_path, "-o", tmp_path / "x.npz", "--allow-truncated") == 0
    assert "warning:" in capsys.readouterr().err and (tmp_path / "x.npz").is_file()


def test_extract_from_a_codec_only_file_says_so(tiny_model, tmp_path, capsys):
    assert main("convert", tiny_model.f16_path, tmp_path / "c.gguf", "--extract") == 1
    assert "already codec-only (architecture 'fish-speech-codec')" in error_line(capsys)
    assert not (tmp_path / "c.gguf").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, match", [
    (["--seconds", "1e9"], "argument --seconds: expected 2.3e-05 to 120 seconds, got 1e9"),  # was a 321 TiB traceback
    (["--seconds", "0.00001"], "argument --seconds: expected"),  # failed after writing the model and input
    (["--seconds", "130"], "argument --seconds: expected"),  # past one encode's limit
    (["--seed", "-1"], "argument --seed: expected a non-negative integer, got -1"),
])
def test_demo_refuses_bad_options_before_writing(tmp_path, capsys, argv, match):
    assert main("demo", "-o", tmp_path / "demo", *argv) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_too_many_threads_is_an_error_not_a_crash(tiny_model, tone, tmp_path, capsys):
    """65536 threads crashed the process inside ggml."""
    assert main("encode", tone, "-m", tiny_model.f32_path, "-o", tmp_path / "x.npz", "--threads", "100000") == 2
    assert "argument --threads: expected at most 512 threads (ggml's most), got 100000" in capsys.readouterr().err
    assert main("encode", tone, "-m", tiny_model.f32_path, "-o", tmp_path / "x.npz", "--device", "-1") == 2
    assert "argument --device: expected a non-negative integer, got -1" in capsys.readouterr().err


@pytest.mark.parametrize("subtype", ["float", "pcm16"])
def test_an_output_format_that_cannot_hold_the_samples_is_a_usage_error(tiny_model, tone, tmp_path, capsys, subtype):
    """.ogg failed after loading and computing, whichever --subtype (exit 1)."""
    assert main("roundtrip", tone, "-m", tiny_model.f32_path, "-o", tmp_path / "x.ogg", "--subtype", subtype) == 2
    sample = {"float": "FLOAT", "pcm16": "PCM_16"}[subtype]
    assert f"x.ogg: OGG files cannot hold {sample} samples; write .wav, .flac or .aiff" in capsys.readouterr().err
    assert not (tmp_path / "x.ogg").exists()
