""".s2voice files of the C++ engine: files it wrote, and files it reads.

* Golden files (tests/golden/s2voice/, written by tools/make_s2voice_golden.py with s2.cpp's
  own ``VoiceProfile::save``): this library reads each exactly, and writes the same bytes for
  the same profile. Empty, ASCII and UTF-8 transcripts; T = 1, 7 and 250; int32 extremes.
* With PYGGML_S2CPP_DIR set to an s2.cpp source tree, live: the voice tool is compiled from the
  tree's src/s2_voice.cpp; s2.cpp writes and this library reads, this library writes (also
  through ``pyggml-codec encode --transcript``) and s2.cpp reads. Without the tree these skip
  with the reason: a CI machine without an s2.cpp checkout cannot run them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from devscripts import load_script
from pyggml_codec.cli import main as cli_main
from pyggml_codec.io.codefiles import CodeFile, S2VoiceFile, read_codes, to_bytes, write_codes

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "s2voice"
PROFILES = json.loads((GOLDEN / "profiles.json").read_text(encoding="utf-8"))["profiles"]
TINY_F16 = REPO / "tests" / "golden" / "s2cpp" / "tiny_f16_s0.gguf"


@pytest.fixture(scope="module")
def golden_codes() -> dict[str, np.ndarray]:
    with np.load(GOLDEN / "codes.npz", allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def test_the_set_covers_what_it_claims(golden_codes):
    assert {p["T"] for p in PROFILES.values()} >= {1, 7, 250}
    texts = [p["transcript"] for p in PROFILES.values()]
    assert "" in texts and any(t and t.isascii() for t in texts) and any(not t.isascii() for t in texts)
    assert sorted(golden_codes) == sorted(PROFILES)
    for name, p in PROFILES.items():
        assert hashlib.sha256((GOLDEN / f"{name}.s2voice").read_bytes()).hexdigest() == p["sha256"], name
        assert golden_codes[name].dtype == np.int32 and golden_codes[name].shape == (p["num_codebooks"], p["T"])


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_we_read_engine_files_exactly(name, golden_codes):
    p = PROFILES[name]
    cf = read_codes(GOLDEN / f"{name}.s2voice")
    np.testing.assert_array_equal(cf.codes, golden_codes[name])
    assert cf.codes.dtype == np.int32
    assert (cf.sample_rate, cf.transcript, cf.n_samples) == (p["sample_rate"], p["transcript"], None)
    assert cf.meta == {"version": 1, "codebook_size": p["codebook_size"]}
    voice = S2VoiceFile.load(GOLDEN / f"{name}.s2voice")
    assert (voice.sample_rate, voice.codebook_size, voice.transcript) == (p["sample_rate"], p["codebook_size"],
                                                                          p["transcript"])


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_we_write_the_engine_bytes(name, golden_codes, tmp_path):
    p = PROFILES[name]
    golden = (GOLDEN / f"{name}.s2voice").read_bytes()
    cf = CodeFile(golden_codes[name], sample_rate=p["sample_rate"], transcript=p["transcript"],
                  meta={"codebook_size": p["codebook_size"]})
    assert to_bytes(cf, "s2voice") == golden
    assert write_codes(tmp_path / "v.s2voice", cf).read_bytes() == golden
    assert S2VoiceFile(golden_codes[name], p["sample_rate"], p["codebook_size"], p["transcript"]).to_bytes() == golden


# --------------------------------------------------------------------------- against a live s2.cpp


def _make_golden_module():
    return load_script("tools/make_s2voice_golden.py")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """(the voice-tool helpers, the compiled tool) for the tree PYGGML_S2CPP_DIR names."""
    tree = os.environ.get("PYGGML_S2CPP_DIR")
    if not tree:
        pytest.skip("PYGGML_S2CPP_DIR (an s2.cpp source tree) is not set: the live .s2voice checks need "
                    "s2.cpp's src/s2_voice.cpp")
    tool = _make_golden_module()
    return tool, tool.build_tool(tree, tmp_path_factory.mktemp("s2voice_tool"))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_live_engine_and_library_agree_on_the_golden_profiles(engine, name, golden_codes, tmp_path):
    tool, exe = engine
    p, codes = PROFILES[name], golden_codes[name]
    theirs = tool.write_with_s2cpp(exe, tmp_path / "theirs.s2voice", codes, p["sample_rate"], p["codebook_size"],
                                   p["transcript"])
    assert theirs.read_bytes() == (GOLDEN / f"{name}.s2voice").read_bytes()  # the engine still writes the golden
    ours = write_codes(tmp_path / "ours.s2voice", read_codes(theirs))
    assert ours.read_bytes() == theirs.read_bytes()
    back = tool.read_with_s2cpp(exe, ours)
    np.testing.assert_array_equal(back["codes"], codes)
    assert (back["sample_rate"], back["codebook_size"], back["transcript"]) == (p["sample_rate"], p["codebook_size"],
                                                                                p["transcript"])


def test_live_random_profiles_both_ways(engine, tmp_path):
    tool, exe = engine
    rng = np.random.default_rng(32)
    alphabet = list("abc XYZ.,!?'\"\\\n\t") + ["é", "ß", "—", "世", "界", "🎙", "\u00a0", "\u200b"]
    for i in range(12):
        n_cb, n_frames = int(rng.integers(1, 12)), int(rng.integers(0, 300))
        codes = rng.integers(-(2**31), 2**31, size=(n_cb, n_frames)).astype(np.int32)
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 60))))
        rate, cb_size = int(rng.integers(1, 2**31)), int(rng.integers(1, 2**31))
        theirs = tool.write_with_s2cpp(exe, tmp_path / f"t{i}.s2voice", codes, rate, cb_size, text)
        cf = read_codes(theirs)
        np.testing.assert_array_equal(cf.codes, codes)
        assert (cf.sample_rate, cf.meta["codebook_size"], cf.transcript) == (rate, cb_size, text)
        ours = S2VoiceFile(codes, rate, cb_size, text).save(tmp_path / f"o{i}.s2voice")
        assert ours.read_bytes() == theirs.read_bytes()
        back = tool.read_with_s2cpp(exe, ours)
        np.testing.assert_array_equal(back["codes"], codes)
        assert (back["sample_rate"], back["codebook_size"], back["transcript"]) == (rate, cb_size, text)


def test_live_engine_reads_an_encoded_voice_with_its_transcript(engine, tmp_path):
    tool, exe = engine
    x = 0.3 * np.sin(2 * np.pi * 220 * np.arange(30000) / 44100) * np.linspace(0.2, 1, 30000)
    sf.write(tmp_path / "ref.wav", x, 44100, subtype="FLOAT")
    text = "Das ist die Referenz — 参考。"
    out = tmp_path / "ref.s2voice"
    assert cli_main.main(["encode", str(tmp_path / "ref.wav"), "-m", str(TINY_F16), "-o", str(out), "-q",
                          "--pad-to", "frame_length", "--transcript", text]) == 0
    back = tool.read_with_s2cpp(exe, out)
    cf = read_codes(out)
    np.testing.assert_array_equal(back["codes"], cf.codes)
    assert back["transcript"] == text and back["transcript_bytes"] == text.encode("utf-8")
    assert (back["num_codebooks"], back["T_prompt"], back["sample_rate"]) == (10, cf.n_frames, 44100)
    assert back["codebook_size"] == cf.meta["codebook_size"] == 64  # the tiny model's largest codebook


def test_live_engine_rejects_what_we_reject(engine, tmp_path):
    """A file cut short fails in both readers (the engine's reader names it truncated)."""
    tool, exe = engine
    raw = (GOLDEN / "t7_ascii.s2voice").read_bytes()
    (tmp_path / "cut.s2voice").write_bytes(raw[:-3])
    with pytest.raises(tool.VoiceToolError, match="truncated"):
        tool.read_with_s2cpp(exe, tmp_path / "cut.s2voice")
    with pytest.raises(ValueError, match="truncated"):
        read_codes(tmp_path / "cut.s2voice")
