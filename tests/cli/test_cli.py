"""The command line end to end (``python -m pyggml_codec`` in a subprocess) on the tiny model.

Codes and audio written by the CLI are checked against the library called in-process on
the same inputs: same codes exactly, same audio to 1e-6 (same backend, same graphs; the
tolerance only absorbs thread-order summation differences).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import pyggml_codec
from pyggml_codec.cli import main as cli_main
from pyggml_codec.io.audio import resample
from pyggml_codec.cli.codec_commands import file_sha256
from pyggml_codec.io.codefiles import read_codes

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
ERROR_CASES = [  # (argv, exit status, text in the error line); a garbage "model" proves checks run first
    (["encode", "{ws}/missing.wav", "-m", "{model}", "-o", "{tmp}/x.npz"], 1, "missing.wav: no such file"),
    (["encode", "{ws}/tone.wav", "-m", "{tmp}/missing.gguf", "-o", "{tmp}/x.npz"], 1, "no such model file"),
    (["encode", "{ws}/tone.wav", "-m", "{ws}/garbage.bin", "-o", "{tmp}/x.txt"], 2, "must end in one of"),
    (["encode", "{ws}/tone.wav", "-m", "{ws}/garbage.bin", "-o", "{tmp}/x.npy", "--transcript", "t"], 2, "--transcript"),
    (["encode", "{ws}/garbage.bin", "-m", "{ws}/garbage.bin", "-o", "{tmp}/x.npz"], 1, "cannot decode audio"),
    (["encode", "{ws}/tone.wav", "-m", "{ws}/garbage.bin", "-o", "{tmp}/x.npz", "--backend", "cpu"], 1, "garbage.bin"),
    (["decode", "{ws}/garbage.bin", "-m", "{model}", "-o", "{tmp}/x.wav"], 2, "input must end in"),
    (["decode", "{tmp}/bad.npz", "-m", "{model}", "-o", "{tmp}/x.wav"], 1, "corrupt .npz container"),
    (["decode", "{tmp}/bad.npz", "-m", "{model}", "-o", "{tmp}/x.xyz"], 2, "audio output must end in"),
    (["roundtrip", "{ws}", "-m", "{model}", "-o", "{tmp}/x.wav"], 2, "not a directory"),
    (["info", "{ws}/garbage.bin"], 1, "not a GGUF file"),
    (["encode", "{ws}/tone.wav", "-m", "{model}", "-o", "{tmp}/x.npz", "--threads", "0"], 2, "positive integer"),
    (["encode", "{ws}/tone.wav", "-m", "{model}", "-o", "{tmp}/x.npz", "--backend", "tpu"], 2, "invalid choice"),
    (["nosuch"], 2, "invalid choice"),
]
N_TONE = 57000  # 1.29 s: not a multiple of the 2048-sample code frame, so trimming shows


def run(*args, cwd=None, script=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(script)] if script else [sys.executable, "-m", "pyggml_codec"]
    proc = subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def ok(*args, **kw) -> subprocess.CompletedProcess:
    proc = run(*args, **kw)
    assert proc.returncode == 0, proc.stderr
    return proc


def main(*args) -> int:
    """The CLI in-process (for the cheaper checks; the subprocess runs cover the entry point)."""
    return cli_main.main([str(a) for a in args])


def tone(rate: int, n: int, freq: float = 440.0, channels: int = 1) -> np.ndarray:
    x = 0.4 * np.sin(2 * np.pi * freq * np.arange(n) / rate)
    return np.stack([x] * channels, axis=1) if channels > 1 else x


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    sf.write(d / "tone.wav", tone(44100, N_TONE), 44100, subtype="FLOAT")
    sf.write(d / "stereo16.wav", tone(16000, 12000, 1000, channels=2), 16000, subtype="FLOAT")
    sf.write(d / "stereo48.flac", tone(48000, 30000, 1000, channels=2), 48000)
    (d / "garbage.bin").write_bytes(b"this is not audio, codes or a model" * 4)
    return d


@pytest.fixture(scope="module")
def codec(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, "cpu") as c:
        yield c


def test_encode_npz_then_decode_trims_to_the_original_length(tiny_model, ws, codec, tmp_path):
    m = tiny_model.f32_path
    enc = ok("encode", ws / "tone.wav", "-m", m, "-o", tmp_path / "a.npz", "--backend", "cpu")
    assert "frames" in enc.stderr and "x real time" in enc.stderr and "backend cpu" in enc.stderr
    cf = read_codes(tmp_path / "a.npz")
    x = sf.read(ws / "tone.wav", dtype="float32")[0]
    np.testing.assert_array_equal(cf.codes, codec.encode(x))
    assert (cf.n_samples, cf.sample_rate, cf.meta["pad_to"]) == (N_TONE, 44100, "code_frame")
    assert cf.meta["model_sha256"] == file_sha256(m) and cf.meta["library_version"] == pyggml_codec.__version__
    assert cf.meta["codebook_sizes"] == codec.config.quantizer.codebook_sizes
    ok("decode", tmp_path / "a.npz", "-m", m, "-o", tmp_path / "a.wav", "-q")
    wave, rate = sf.read(tmp_path / "a.wav", dtype="float32")
    assert rate == 44100 and wave.shape == (N_TONE,) and sf.info(tmp_path / "a.wav").subtype == "FLOAT"
    np.testing.assert_allclose(wave, codec.decode(cf.codes)[:N_TONE], atol=1e-6)


def test_s2voice_and_npy_outputs(tiny_model, ws, codec, tmp_path):
    m = tiny_model.f32_path
    ok("encode", ws / "tone.wav", "-m", m, "-o", tmp_path / "a.s2voice", "--transcript", "héllo", "--pad-to", "frame_length")
    assert main("encode", ws / "tone.wav", "-m", m, "-o", tmp_path / "a.npy", "--pad-to", "frame_length",
                "--precision", "s2cpp") == 0
    voice = read_codes(tmp_path / "a.s2voice")
    x = sf.read(ws / "tone.wav", dtype="float32")[0]
    np.testing.assert_array_equal(voice.codes, codec.encode(x, pad_to="frame_length"))
    assert voice.transcript == "héllo" and voice.sample_rate == 44100
    assert voice.meta["codebook_size"] == max(codec.config.quantizer.codebook_sizes)
    assert np.load(tmp_path / "a.npy").dtype == np.int64
    ok("decode", tmp_path / "a.s2voice", "-m", m, "-o", tmp_path / "v.wav")
    assert main("decode", tmp_path / "a.npy", "-m", m, "-o", tmp_path / "n.flac", "--subtype", "pcm16") == 0
    frames = voice.n_frames * 2048  # neither format records the original length
    assert sf.info(tmp_path / "v.wav").frames == frames
    assert sf.info(tmp_path / "n.flac").frames == frames and sf.info(tmp_path / "n.flac").subtype == "PCM_16"


def test_resampled_stereo_inputs(tiny_model, ws, tmp_path):
    m = tiny_model.f32_path
    ok("roundtrip", ws / "stereo16.wav", "-m", m, "-o", tmp_path / "rt.wav", "--resample", "linear")
    assert sf.info(tmp_path / "rt.wav").frames == math.ceil(12000 * 44100 / 16000)
    assert main("encode", ws / "stereo48.flac", "-m", m, "-o", tmp_path / "s.npz") == 0
    x = sf.read(ws / "stereo48.flac", dtype="float32")[0].mean(axis=1)
    assert read_codes(tmp_path / "s.npz").n_samples == len(resample(x, 48000, 44100, "soxr"))


def test_overwrite_needs_force(tiny_model, ws, tmp_path):
    out = tmp_path / "a.npz"
    out.write_bytes(b"precious")
    proc = run("encode", ws / "tone.wav", "-m", tiny_model.f32_path, "-o", out)
    assert proc.returncode == 1 and proc.stderr.strip() == f"pyggml-codec: error: {out} exists (use --force to overwrite)"
    assert out.read_bytes() == b"precious"
    ok("encode", ws / "tone.wav", "-m", tiny_model.f32_path, "-o", out, "--force", "-q")
    assert read_codes(out).n_samples == N_TONE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz"]  # no temp files


def test_directory_mode_mirrors_the_tree_and_survives_a_bad_file(tiny_model, ws, tmp_path):
    m, src = tiny_model.f32_path, tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    (src / "a.wav").write_bytes((ws / "tone.wav").read_bytes())
    (src / "sub" / "b.flac").write_bytes((ws / "stereo48.flac").read_bytes())
    (src / "sub" / "broken.wav").write_bytes(b"RIFF....WAVEjunk")
    (src / "notes.txt").write_text("not audio, not walked")
    proc = run("encode", src, "-m", m, "-o", tmp_path / "codes", "--progress")
    assert proc.returncode == 1
    assert "broken.wav" in proc.stderr and "1 of 3 file(s) failed" in proc.stderr
    produced = sorted(p.relative_to(tmp_path / "codes").as_posix() for p in (tmp_path / "codes").rglob("*") if p.is_file())
    assert produced == ["a.npz", "sub/b.npz"]
    (src / "sub" / "broken.wav").unlink()
    again = ok("encode", src, "-m", m, "-o", tmp_path / "codes")
    assert "skipping 2 existing output(s)" in again.stderr
    (tmp_path / "codes" / "sub" / "junk.s2voice").write_bytes(b"S2VOICE\0" + bytes(10))
    dec = run("decode", tmp_path / "codes", "-m", m, "-o", tmp_path / "wavs")
    assert dec.returncode == 1 and "junk.s2voice" in dec.stderr and "too short" in dec.stderr
    assert sf.info(tmp_path / "wavs" / "a.wav").frames == N_TONE
    assert (tmp_path / "wavs" / "sub" / "b.wav").is_file()


def test_info_backends_and_convert(tiny_model, tmp_path, capsys):
    from pyggml_codec.model.convert import write_merged_fixture

    def out(*args) -> str:
        assert main(*args) == 0
        return capsys.readouterr().out

    text = out("info", tiny_model.f32_path)
    assert "fish-speech-codec" in text and "loadable         yes" in text
    info = json.loads(ok("info", tiny_model.f16_path, "--json").stdout)
    assert info["tensors"]["codec"] == info["tensors"]["expected"] and set(info["dtypes"]) == {"F16"}
    assert info["bytes_per_part"]["all"] == info["dtypes"]["F16"]["bytes"]
    assert 0 < info["bytes_per_part"]["decode"] < info["bytes_per_part"]["all"]
    assert info["config"]["derived"]["samples_per_frame"] == 2048
    merged = write_merged_fixture(tiny_model.f16_path, tmp_path / "merged.gguf")
    minfo = json.loads(out("info", merged, "--json"))
    assert (minfo["architecture"], minfo["tensor_prefix"], minfo["loadable"]) == ("fish-speech", "c.", True)
    ok("convert", merged, tmp_path / "codec.gguf", "--extract")
    assert json.loads(out("info", tmp_path / "codec.gguf", "--json"))["bytes_per_part"] == info["bytes_per_part"]
    assert main("convert", merged, tmp_path / "codec.gguf", "--extract") == 1
    assert "exists (use --force" in capsys.readouterr().err
    assert main("convert", merged, tmp_path / "codec.gguf", "--extract", "--force", "-q") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["codec.gguf", "merged.gguf"]
    backends = json.loads(ok("backends", "--json").stdout)
    assert "cpu" in backends["backends"] and backends["devices"][0]["memory_total"] > 0
    assert "cpu" in out("backends")


def test_demo_needs_no_model(tmp_path):
    proc = ok("demo", "-o", tmp_path / "demo", "--seconds", "1", "--backend", "cpu")
    assert "RANDOM weights" in proc.stdout and "real time" in proc.stdout
    assert sf.info(tmp_path / "demo" / "output.wav").frames == 44100
    assert read_codes(tmp_path / "demo" / "codes.npz").n_frames == math.ceil(44100 / 2048)
    assert main("demo", "-o", tmp_path / "demo") == 1  # refuses to overwrite
    quiet = ok("demo", "-o", tmp_path / "demo", "--seconds", "0.5", "--backend", "cpu", "--force", "-q")
    assert quiet.stdout == ""  # -q: the files are written, no summary


def _errors_case(argv, ws, tmp_path, model):
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 truncated zip")
    return [a.format(ws=ws, tmp=tmp_path, model=model) for a in argv]


def _check_error(status, stderr, expected_status, message, tmp_path):
    assert status == expected_status, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("pyggml-codec") and "error:" in last and message in last, stderr
    if expected_status == 1:
        assert len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "x.npz").exists() and not (tmp_path / "x.wav").exists()


@pytest.mark.parametrize("argv, status, message", [ERROR_CASES[i] for i in (0, 2, 7)])
def test_user_errors_in_a_subprocess(tiny_model, ws, tmp_path, argv, status, message):
    proc = run(*_errors_case(argv, ws, tmp_path, tiny_model.f32_path))
    _check_error(proc.returncode, proc.stderr, status, message, tmp_path)


@pytest.mark.parametrize("argv, status, message", ERROR_CASES)
def test_user_errors_exit_with_one_line(tiny_model, ws, tmp_path, capsys, argv, status, message):
    """The same cases through main() in-process (fast): exit status, one-line message."""
    try:
        code = cli_main.main(_errors_case(argv, ws, tmp_path, tiny_model.f32_path))
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    _check_error(code, capsys.readouterr().err, status, message, tmp_path)


def test_wrong_model_for_the_codes(tiny_model, tmp_path, codec):
    from pyggml_codec.io.codefiles import CodeFile, write_codes

    write_codes(tmp_path / "c.npz", CodeFile(np.zeros((4, 3), np.int32), sample_rate=44100))
    assert cli_main.main(["decode", str(tmp_path / "c.npz"), "-m", str(tiny_model.f32_path),
                          "-o", str(tmp_path / "x.wav"), "-q"]) == 1
    write_codes(tmp_path / "r.npz", CodeFile(np.zeros((10, 3), np.int32), sample_rate=16000))
    assert cli_main.main(["decode", str(tmp_path / "r.npz"), "-m", str(tiny_model.f32_path),
                          "-o", str(tmp_path / "x.wav")]) == 1
    assert not (tmp_path / "x.wav").exists()


def test_diagnostics_subcommands_register_when_present(monkeypatch):
    fake = types.ModuleType("pyggml_codec.cli.diagnostics")

    def register_cli(sub, parents=()):
        p = sub.add_parser("compare", parents=parents)
        p.set_defaults(func=lambda args: 7)

    fake.register_cli = register_cli
    monkeypatch.setitem(sys.modules, "pyggml_codec.cli.diagnostics", fake)
    assert cli_main.main(["compare"]) == 7
    monkeypatch.setitem(sys.modules, "pyggml_codec.cli.diagnostics", types.ModuleType("pyggml_codec.cli.diagnostics"))
    with pytest.raises(SystemExit):  # no register_cli: no such command, parser still works
        cli_main.get_parser().parse_args(["compare"])


def test_a_broken_diagnostics_module_only_warns(monkeypatch, capsys):
    def broken(name):
        raise AttributeError("module 'pyggml_codec.compare' has no attribute 'x'")

    monkeypatch.setattr(cli_main.importlib, "import_module", broken)
    assert cli_main.main(["backends"]) == 0
    assert "warning: diagnostics commands unavailable (AttributeError" in capsys.readouterr().err


@pytest.mark.parametrize("script, expect", [
    ("encode_decode.py", "-> codes (10, "),
    ("streaming_playback.py", "stream.wav: 1."),  # run with --chunk 16 --seconds 1 (below)
    ("compare_backends.py", "cpu: "),
])
def test_examples_run(tiny_model, tmp_path, script, expect):
    extra = ["--chunk", 16, "--seconds", 1] if script == "streaming_playback.py" else []
    proc = ok("--model", tiny_model.f32_path, *extra, script=EXAMPLES / script, cwd=tmp_path)
    assert expect in proc.stdout
    assert list(tmp_path.iterdir()) == []  # outputs go to a temp folder, not the working directory


def test_a_closed_pipe_ends_quietly(tiny_model):
    """``info | head -1``: the reader leaves early. It printed "error: [Errno 32] Broken pipe"."""
    proc = subprocess.Popen([sys.executable, "-m", "pyggml_codec", "info", str(tiny_model.f32_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # buffered: the write comes at the end
    proc.stdout.close()  # before anything is read: every write fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Broken pipe" not in err and "Traceback" not in err, err
