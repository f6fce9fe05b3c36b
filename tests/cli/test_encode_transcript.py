"""``encode --transcript``: checked before the model loads, stored as UTF-8 in the voice file."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from pyggml_codec.cli import main as cli_main
from pyggml_codec.io.codefiles import S2VoiceFile, read_codes


@pytest.fixture()
def tone(tmp_path):
    path = tmp_path / "tone.wav"
    sf.write(path, 0.3 * np.sin(np.arange(5000) * 0.05), 44100, subtype="FLOAT")
    (tmp_path / "garbage.gguf").write_bytes(b"not a model" * 8)  # any model check after ours would fail
    return path


@pytest.mark.parametrize("text, reason", [("a\0b", "--transcript cannot contain NUL"),
                                          ("\udcff", "--transcript is not valid Unicode text")])
def test_a_transcript_no_file_can_hold_is_a_usage_error(tone, tmp_path, capsys, text, reason):
    out = tmp_path / "v.s2voice"
    assert cli_main.main(["encode", str(tone), "-m", str(tmp_path / "garbage.gguf"), "-o", str(out),
                          "--transcript", text]) == 2
    assert reason in capsys.readouterr().err
    assert not out.exists()


def test_transcript_reaches_the_voice_file(tone, tiny_model, tmp_path):
    text = "Grüße — the reference text, 世界"
    out = tmp_path / "v.s2voice"
    assert cli_main.main(["encode", str(tone), "-m", str(tiny_model.f16_path), "-o", str(out), "-q",
                          "--transcript", text]) == 0
    raw = out.read_bytes()
    voice = S2VoiceFile.from_bytes(raw)
    assert voice.transcript == text and raw[44:44 + len(text.encode()) + 1] == text.encode("utf-8") + b"\0"
    assert voice.codebook_size == 64 and voice.sample_rate == 44100  # the tiny model's largest codebook
    np.testing.assert_array_equal(read_codes(out).codes, voice.codes)


def test_a_voice_file_without_transcript_is_written_with_a_warning(tone, tiny_model, tmp_path, capsys):
    """s2.cpp ignores a voice profile without reference text when cloning: say so, even with -q."""
    out = tmp_path / "v.s2voice"
    assert cli_main.main(["encode", str(tone), "-m", str(tiny_model.f16_path), "-o", str(out), "-q"]) == 0
    assert "gets no transcript" in capsys.readouterr().err
    assert S2VoiceFile.from_bytes(out.read_bytes()).transcript == ""
    npz = tmp_path / "v.npz"
    assert cli_main.main(["encode", str(tone), "-m", str(tiny_model.f16_path), "-o", str(npz), "-q"]) == 0
    assert "transcript" not in capsys.readouterr().err
