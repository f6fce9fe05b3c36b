"""Code files: byte-exact round trips, the documented s2voice layout, and hostile input.

Every reader must either parse a file or raise CodeFileError naming the reason: the
property tests mutate valid files at random and accept nothing else.
"""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyggml_codec.io.codefiles import (
    EXTENSIONS,
    FORMATS,
    S2VOICE_HEADER,
    CodeFile,
    CodeFileError,
    NpyFile,
    NpzFile,
    S2VoiceFile,
    encode_transcript,
    from_bytes,
    read_codes,
    to_bytes,
    write_codes,
)
from pyggml_codec.errors import CodecError

SIZES = (64,) + (32,) * 9


def sample(n_frames: int = 7, seed: int = 0, transcript: str | None = "héllo wörld") -> CodeFile:
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, s, n_frames) for s in SIZES])
    meta = {"pad_to": "code_frame", "model_sha256": "ab" * 32, "library_version": "0.1.0",
            "codebook_sizes": SIZES, "samples_per_frame": 2048}
    return CodeFile(codes, sample_rate=44100, n_samples=n_frames * 2048 - 100, transcript=transcript, meta=meta)


@pytest.mark.parametrize("ext", [".npz", ".npy", ".s2voice"])
def test_write_read_write_is_byte_exact(tmp_path, ext):
    first, second = tmp_path / f"a{ext}", tmp_path / f"b{ext}"
    cf = sample()
    write_codes(first, cf)
    back = read_codes(first)
    np.testing.assert_array_equal(back.codes, cf.codes)
    assert back.codes.dtype == np.int32 and back.codes.shape == (10, 7)
    write_codes(second, back)
    assert first.read_bytes() == second.read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left


def test_npz_keeps_every_field(tmp_path):
    cf = sample()
    write_codes(tmp_path / "c.npz", cf)
    back = read_codes(tmp_path / "c.npz")
    assert (back.sample_rate, back.n_samples, back.transcript) == (44100, 7 * 2048 - 100, "héllo wörld")
    assert back.meta["codebook_sizes"] == SIZES and back.meta["pad_to"] == "code_frame"
    assert back.meta["model_sha256"] == "ab" * 32 and back.meta["format_version"] == 1
    with np.load(tmp_path / "c.npz", allow_pickle=False) as z:  # readable by plain numpy
        assert z["codes"].dtype == np.int32 and int(z["n_samples"]) == 7 * 2048 - 100


def test_npy_is_the_upstream_layout(tmp_path):
    cf = sample()
    write_codes(tmp_path / "c.npy", cf)
    arr = np.load(tmp_path / "c.npy", allow_pickle=False)
    assert arr.dtype == np.int64 and arr.shape == (10, 7)
    np.save(tmp_path / "i32.npy", cf.codes.astype(np.int32))
    np.save(tmp_path / "fortran.npy", np.asfortranarray(cf.codes.astype(np.int64)))
    np.save(tmp_path / "big.npy", cf.codes.astype(">i8"))
    for name in ("i32.npy", "fortran.npy", "big.npy"):
        np.testing.assert_array_equal(read_codes(tmp_path / name).codes, cf.codes)


@pytest.mark.parametrize("arr, reason", [
    (np.zeros((10, 3), np.float32), "not int32 or int64"),
    (np.zeros((1, 10, 3), np.int64), "not 2-D"),
    (np.zeros((10, 3), np.uint32), "not int32 or int64"),
    (np.array([2**40] * 3 + [0] * 27, np.int64).reshape(10, 3), "fit in int32"),
])
def test_npy_refuses_non_codes(tmp_path, arr, reason):
    np.save(tmp_path / "x.npy", arr)
    with pytest.raises(CodeFileError, match=reason):
        read_codes(tmp_path / "x.npy")


def test_s2voice_hand_built_bytes_parse_as_documented(tmp_path):
    codes = np.array([[1, 2, 3], [4, 5, 6]], dtype="<i4")
    text = b"hi"
    raw = (b"S2VOICE\0" + struct.pack("<I", 1) + struct.pack("<iiii", 2, 3, 24000, 1024)
           + struct.pack("<QQ", len(text) + 1, codes.nbytes) + text + b"\0" + codes.tobytes())
    assert len(raw) == 44 + 3 + 24
    (tmp_path / "v.s2voice").write_bytes(raw)
    cf = read_codes(tmp_path / "v.s2voice")
    np.testing.assert_array_equal(cf.codes, codes)
    assert (cf.sample_rate, cf.transcript, cf.n_samples) == (24000, "hi", None)
    assert cf.meta == {"version": 1, "codebook_size": 1024}
    assert to_bytes(cf, "s2voice") == raw


def _s2voice(**fields) -> bytes:
    head = {"magic": b"S2VOICE\0", "version": 1, "n_cb": 2, "t": 3, "rate": 44100, "cb": 1024, "tlen": 1, "csize": 24}
    head.update(fields)
    body = fields.pop("body", b"\0" + bytes(24))
    return S2VOICE_HEADER.pack(*[head[k] for k in ("magic", "version", "n_cb", "t", "rate", "cb", "tlen", "csize")]) + body


@pytest.mark.parametrize("raw, reason", [
    (_s2voice()[:40], "too short"),
    (_s2voice(magic=b"S2VOICEX"), "magic"),
    (_s2voice(version=2), "version 2"),
    (_s2voice(n_cb=0, csize=0), "num_codebooks = 0"),
    (_s2voice(t=-1), "T = -1"),
    (_s2voice(csize=20), "codes_size = 20"),
    (_s2voice(t=2**31 - 1, csize=2 * (2**31 - 1) * 4), "truncated"),  # never allocated
    (_s2voice(tlen=2**63), "truncated"),
    (_s2voice(tlen=0), "transcript_len = 0"),
    (_s2voice() + b"\0", "1 trailing bytes"),
    (_s2voice(tlen=2, body=b"ab" + bytes(24)), "not NUL-terminated"),
    (_s2voice(tlen=3, body=b"a\0\0" + bytes(24)), "NUL byte before its end"),
    (_s2voice(tlen=2, body=b"\xff\0" + bytes(24)), "not UTF-8"),
])
def test_s2voice_rejects_malformed(raw, reason):
    with pytest.raises(CodeFileError, match=reason):
        from_bytes(raw, "s2voice")


def _npz(**members) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **members)
    return buf.getvalue()


@pytest.mark.parametrize("raw, reason", [
    (b"not a zip", "corrupt .npz"),
    (_npz(codes=np.zeros((10, 2), np.int32), n_codebooks=10), "missing member 'format_version'"),
    (_npz(codes=np.zeros((10, 2), np.int32), n_codebooks=10, format_version=9), "version 9"),
    (_npz(codes=np.zeros((10, 2), np.int32), n_codebooks=10, format_version=1, extra=1), "unexpected member"),
    (_npz(codes=np.zeros((10, 2), np.int32), n_codebooks=9, format_version=1), "n_codebooks = 9"),
    (_npz(codes=np.zeros((10, 2), np.int32), n_codebooks=10, format_version=1, n_samples=5000,
          samples_per_frame=2048), "n_samples = 5000"),
    (_npz(codes=np.zeros((10, 2), np.int32), n_codebooks=10, format_version=1, pad_to="x"), "pad_to"),
    (_npz(codes=np.zeros((10, 2), np.float64), n_codebooks=10, format_version=1), "not int32 or int64"),
])
def test_npz_rejects_malformed(raw, reason):
    with pytest.raises(CodeFileError, match=reason):
        from_bytes(raw, "npz")


def test_errors_are_documented_classes(tmp_path):
    assert issubclass(CodeFileError, CodecError) and issubclass(CodeFileError, ValueError)
    with pytest.raises(CodeFileError, match="unknown code file extension"):
        write_codes(tmp_path / "x.txt", sample())
    with pytest.raises(FileNotFoundError):
        read_codes(tmp_path / "missing.npz")
    with pytest.raises(CodeFileError, match="codebook_size"):
        to_bytes(CodeFile(np.zeros((2, 2), np.int32), sample_rate=44100), "s2voice")
    with pytest.raises(CodeFileError, match="NUL"):
        to_bytes(CodeFile(np.zeros((2, 2), np.int32), 44100, transcript="a\0b", meta={"codebook_size": 4}), "s2voice")


def test_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "v.s2voice"
    write_codes(path, sample())
    before = path.read_bytes()
    with pytest.raises(CodeFileError):
        write_codes(path, CodeFile(np.zeros((2, 2), np.int32)))  # no sample rate: refused
    assert path.read_bytes() == before and len(list(tmp_path.iterdir())) == 1


# --------------------------------------------------------------------------- the format classes


def test_one_class_per_extension():
    assert sorted(cls.EXTENSION for cls in FORMATS.values()) == sorted(EXTENSIONS)
    assert {kind: cls.VERSION for kind, cls in FORMATS.items()} == {"npz": 1, "npy": 1, "s2voice": 1}
    assert all(FORMATS[cls.EXTENSION[1:]] is cls for cls in (NpyFile, NpzFile, S2VoiceFile))


@pytest.mark.parametrize("cls", [NpyFile, NpzFile, S2VoiceFile])
def test_format_class_save_load_is_write_read(tmp_path, cls):
    cf = sample()
    typed = cls.from_code_file(cf)
    path = typed.save(tmp_path / f"a{cls.EXTENSION}")
    assert path.read_bytes() == typed.to_bytes() == to_bytes(cf, cls.EXTENSION[1:])
    back = cls.load(path)
    assert back == typed and back != cls.from_code_file(sample(seed=1))
    np.testing.assert_array_equal(back.to_code_file().codes, read_codes(path).codes)
    with pytest.raises(CodeFileError, match=rf"must be named \*\{cls.EXTENSION}"):
        typed.save(tmp_path / "wrong.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"a{cls.EXTENSION}"]


def test_s2voice_class_holds_the_profile_fields():
    voice = S2VoiceFile(np.arange(6).reshape(2, 3), sample_rate=24000, codebook_size=1024, transcript="hé")
    assert voice.codes.dtype == np.int32 and voice.transcript == "hé"
    raw = voice.to_bytes()
    assert raw[:8] == S2VoiceFile.MAGIC and S2VoiceFile.HEADER.unpack_from(raw)[1:] == (1, 2, 3, 24000, 1024, 4, 24)
    assert S2VoiceFile.from_bytes(raw) == voice and S2VoiceFile.from_bytes(raw).to_bytes() == raw
    for bad, reason in (({"sample_rate": 0}, "sample_rate = 0"), ({"codebook_size": 2**31}, "codebook_size"),
                        ({"sample_rate": 4.5}, "must be an integer"), ({"transcript": b"x"}, "must be text")):
        with pytest.raises(CodeFileError, match=reason):
            S2VoiceFile(**{"codes": np.zeros((2, 3), np.int32), "sample_rate": 1, "codebook_size": 1, **bad})


def test_npz_class_fields_become_meta():
    cf = sample()
    npz = NpzFile.from_code_file(cf)
    assert (npz.codebook_sizes, npz.samples_per_frame, npz.pad_to) == (SIZES, 2048, "code_frame")
    back = NpzFile.from_bytes(npz.to_bytes()).to_code_file()
    assert back.meta == {**cf.meta, "format_version": 1} and back.transcript == cf.transcript
    with pytest.raises(CodeFileError, match="n_samples = 1"):
        NpzFile(np.zeros((1, 3), np.int32), n_samples=1, samples_per_frame=2)
    for bad in ("abc", 44100.7, float("nan"), True):  # 44100.7 Hz was stored as 44100; "abc" failed inside int()
        with pytest.raises(CodeFileError, match=f"sample_rate must be a whole number, got {bad!r}"):
            to_bytes(CodeFile(np.zeros((2, 2), np.int32), bad), "npz")
    assert NpzFile(np.zeros((1, 3), np.int32), sample_rate=44100.0).sample_rate == 44100
    for bad in (44100.7, "abc"):  # the s2voice writer truncated or failed inside int() too
        with pytest.raises(CodeFileError, match="sample_rate must be a whole number"):
            to_bytes(CodeFile(np.zeros((2, 2), np.int32), bad, meta={"codebook_size": 4}), "s2voice")


@pytest.mark.parametrize("text, reason", [
    ("a\0b", "cannot contain NUL"),
    ("end\0", "cannot contain NUL"),
    ("\udcff", "no UTF-8 form"),  # what a non-UTF-8 byte in argv becomes (surrogateescape)
    (b"bytes", "must be text"),
])
@pytest.mark.parametrize("kind", ["s2voice", "npz"])
def test_transcripts_no_file_can_hold_are_refused(text, reason, kind):
    cf = CodeFile(np.zeros((2, 2), np.int32), 44100, transcript=text, meta={"codebook_size": 4})
    with pytest.raises(CodeFileError, match=reason):
        to_bytes(cf, kind)
    with pytest.raises(CodeFileError, match=reason):
        encode_transcript(text)


def test_transcript_is_utf8_on_disk():
    text = "Grüße, 世界 🎙"
    assert encode_transcript(text) == text.encode("utf-8")
    raw = to_bytes(CodeFile(np.zeros((1, 1), np.int32), 44100, transcript=text, meta={"codebook_size": 4}), "s2voice")
    assert raw[44:44 + len(text.encode()) + 1] == text.encode("utf-8") + b"\0"


# --------------------------------------------------------------------------- hostile input

CORPUS = {
    kind: [to_bytes(sample(n, seed, text), kind) for n, seed, text in ((1, 1, ""), (5, 2, "ab"), (9, 3, "文字"))]
    for kind in ("npz", "npy", "s2voice")
}
CORPUS["npy"].append(_npz())  # an empty zip: a foreign file as seed


@st.composite
def mutated(draw, kind: str) -> bytes:
    data = bytearray(draw(st.sampled_from(CORPUS[kind])))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(("flip", "truncate", "insert", "delete", "header")))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[pos:pos + draw(st.integers(1, 8))]
        elif op == "header" and len(data) >= 8:  # a length-like field: small, huge or negative
            at = draw(st.integers(0, min(len(data), 128) - 8))
            data[at:at + 8] = struct.pack("<q", draw(st.sampled_from((0, 1, -1, 2**31, 2**62, -(2**40)))))
    return bytes(data)


def _parses_or_refuses(data: bytes, kind: str) -> None:
    try:
        cf = from_bytes(data, kind)
    except CodeFileError:
        return
    assert cf.codes.dtype == np.int32 and cf.codes.ndim == 2


# The same 200 inputs on every run and machine (no example database in the working folder): a
# failure here reproduces. Longer searches: raise max_examples and drop derandomize locally.
PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(mutated("npy"))
def test_npy_reader_never_raises_anything_else(data):
    _parses_or_refuses(data, "npy")


@PROPERTY
@given(mutated("s2voice"))
def test_s2voice_reader_never_raises_anything_else(data):
    _parses_or_refuses(data, "s2voice")


@PROPERTY
@given(mutated("npz"))
def test_npz_reader_never_raises_anything_else(data):
    _parses_or_refuses(data, "npz")


def test_npz_member_that_is_not_npy_data():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("codes.npy", bytes(1 << 20))
    with pytest.raises(CodeFileError, match="codes: not a valid .npy header"):
        from_bytes(buf.getvalue(), "npz")
