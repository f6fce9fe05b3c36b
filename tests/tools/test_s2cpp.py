"""precision="s2cpp" against the C++ engine s2.cpp, bit for bit.

* Golden dumps (tests/golden/s2cpp/<isa>/, written by tools/make_s2cpp_golden.py from s2.cpp
  2c33261 through this package's harness) on the committed tiny model: every stage of decode and
  encode must equal s2.cpp's, max abs difference 0, at 1 and 2 threads. The set is chosen by
  the ISA key of this ggml build (the summation order of ggml's F16 dot product: avx2, avx512,
  or avx512fp16, measured since ggml reports the same features for the last two); a build with
  no set, or with LLAMAFILE on, skips with the reason.
* With PYGGML_S2CPP_DIR set to an s2.cpp source tree: the harness is built against it and the
  same comparison runs live at more lengths (12 and 158 frames: one and many attention windows).
* Bad input to the comparison: a clear S2cppError, never a hang or a silent pass.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

import pyggml_codec as pc
from pyggml_codec.backend import binding, buildinfo
from pyggml_codec.diagnostics import s2cpp

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "s2cpp"
MODEL = GOLDEN / "tiny_f16_s0.gguf"


def golden_set() -> Path:
    exactness = buildinfo.s2cpp_exactness()
    if exactness["exact"] is False:
        pytest.skip(exactness["reason"])
    isa = exactness["isa"]
    if isa is None or not (GOLDEN / isa).is_dir():
        pytest.skip(f"no golden s2.cpp set for this ggml build's ISA key ({isa}; sets: {', '.join(golden_keys())}; "
                    f"features {binding.cpu_features()}, F16 sums in half precision: "
                    f"{binding.f16_dot_sums_in_half()}): make one with tools/make_s2cpp_golden.py")
    return GOLDEN / isa


def golden_keys() -> list[str]:
    return sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())


def golden_input(path: Path, name: str) -> np.ndarray:
    whole, _ = s2cpp.load_golden(path)
    return whole[name]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["decode", "encode"])
def test_s2cpp_precision_matches_golden_bit_for_bit(kind, threads):
    """Metric: max |ours - s2.cpp| per stage (digests for large stages); tolerance 0."""
    path = golden_set() / f"{kind}.npz"
    data = golden_input(path, "codes" if kind == "decode" else "audio")
    with pc.load(MODEL, backend="cpu", precision="s2cpp", n_threads=threads) as codec:
        ours = s2cpp.our_stages(codec, kind, data)
        report = s2cpp.compare_golden(path, ours)
        print(f"\n{kind}, {threads} thread(s), golden {path.parent.name}:\n{report.table()}")
        assert report.ok, report.verdict()
        assert not report.only_in_a, f"stages missing from ours: {report.only_in_a}"
        if kind == "decode":  # the plain call (no stages kept) is the same one-graph decode
            audio = codec.decode(data)
            assert np.array_equal(audio, golden_input(path, "audio")), "plain decode differs from s2.cpp"
            assert codec.decode_chunk_frames is None


def test_golden_comparison_can_fail():
    """The f32 precision is not s2.cpp's rounding: the same check must report a difference."""
    path = golden_set() / "decode.npz"
    with pc.load(MODEL, backend="cpu", precision="f32") as codec:
        report = s2cpp.compare_golden(path, s2cpp.our_stages(codec, "decode", golden_input(path, "codes")))
    print(report.table())
    assert not report.ok and report.first_failure is not None


def _one_ulp_off(tmp_path: Path, tensor: str, index: int = 0) -> Path:
    """A copy of the golden model with element ``index`` of the F16 ``tensor`` one ulp away
    (its lowest mantissa bit flipped)."""
    from gguf import GGUFReader

    info = next(t for t in GGUFReader(str(MODEL)).tensors if t.name == tensor)
    assert int(info.tensor_type) == 1, f"{tensor} is not F16"
    data = bytearray(MODEL.read_bytes())
    at = int(info.data_offset) + 2 * index
    before = np.frombuffer(bytes(data[at:at + 2]), np.float16)[0]
    data[at] ^= 1
    after = np.frombuffer(bytes(data[at:at + 2]), np.float16)[0]
    assert before != after and abs(float(after) - float(before)) == float(np.spacing(np.float16(min(abs(before), abs(after)))))
    path = tmp_path / "one_ulp.gguf"
    path.write_bytes(bytes(data))
    return path


# (kind, the weight changed by one ulp, the digested stage it first reaches)
ULP_CASES = [("decode", "decoder.model.1.block.1.conv.weight", "dec.block1"),
             ("encode", "encoder.block.1.block.4.conv.weight", "enc.block1")]


@pytest.mark.parametrize("kind,tensor,stage", ULP_CASES)
def test_one_ulp_of_one_weight_fails_a_digested_stage(kind, tensor, stage, tmp_path):
    """Negative control of the golden sets at the smallest change: one weight one F16 ulp off.
    The stages before the weight's first use still equal s2.cpp's; the first stage after it,
    kept only as a digest, must fail, and every later digest with it (codes may survive it)."""
    path = golden_set() / f"{kind}.npz"
    _, meta = s2cpp.load_golden(path)
    assert stage in meta["digests"], f"{stage} is kept whole in {path.name}; the control is for a digest"
    data = golden_input(path, "codes" if kind == "decode" else "audio")
    with pc.load(_one_ulp_off(tmp_path, tensor), backend="cpu", precision="s2cpp", n_threads=1) as codec:
        report = s2cpp.compare_golden(path, s2cpp.our_stages(codec, kind, data))
    print(f"\n{kind}, {tensor}[0] one ulp off:\n{report.table()}")
    names = [s.name for s in report.stages]
    first = names.index(stage)
    assert report.first_failure == stage, report.verdict()
    assert all(s.ok for s in report.stages[:first])
    assert not any(s.ok for s in report.stages[first:] if s.name in meta["digests"])


def test_one_changed_code_fails_the_encode_golden_set():
    """Negative control for encode codes: ours with one code of one codebook changed (every
    stage before the codes left as computed) fails on that codebook's codes and the codes."""
    path = golden_set() / "encode.npz"
    with pc.load(MODEL, backend="cpu", precision="s2cpp", n_threads=1) as codec:
        ours = s2cpp.our_stages(codec, "encode", golden_input(path, "audio"))
    assert s2cpp.compare_golden(path, ours).ok
    codes, vq3 = ours["codes"].copy(), ours["enc.vq3.codes"].copy()
    codes[3, 0] = vq3.flat[0] = (int(codes[3, 0]) + 1) % 32
    report = s2cpp.compare_golden(path, {**ours, "codes": codes, "enc.vq3.codes": vq3})
    print(report.table())
    failed = [s.name for s in report.stages if not s.ok]
    assert failed == ["enc.vq3.codes", "codes"], failed


def test_golden_sets_differ_by_isa():
    """The sets are keyed by ISA because they differ: AVX2's F16 sums round otherwise than AVX-512's,
    and an AVX512-FP16 build's (half precision; the tiny model's 64-element rows fall wholly in its
    scalar leftover loop) otherwise again. Each set's recorded build features give its own key."""
    keys = golden_keys()
    assert {"avx2", "avx512", "avx512fp16"} <= set(keys)
    sets = {key: s2cpp.load_golden(GOLDEN / key / "decode.npz") for key in keys}
    for key, (whole, meta) in sets.items():
        assert meta["isa"] == key and s2cpp.isa_key(meta["ggml"]) == key, (key, meta["ggml"])
        assert np.array_equal(whole["codes"], sets["avx512"][0]["codes"])
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            assert not np.array_equal(sets[a][0]["audio"], sets[b][0]["audio"]), (a, b)


def test_isa_key():
    """The key follows ggml's features and the measured half-precision F16 sums."""
    avx2 = {"AVX": "1", "AVX2": "1", "FMA": "1", "F16C": "1"}
    assert s2cpp.isa_key(avx2) == "avx2"
    assert s2cpp.isa_key({**avx2, "AVX512": "1"}) == "avx512"
    assert s2cpp.isa_key({**avx2, "AVX512": "1", "f16_dot_half": True}) == "avx512fp16"
    assert s2cpp.isa_key({"avx": 1, "avx2": 1, "avx512": 1, "f16_dot_half": 0}) == "avx512"  # the harness's info
    assert s2cpp.isa_key({"AVX": "1", "AVX2": "1"}) is None
    assert buildinfo.build_isa_key() == buildinfo.s2cpp_exactness()["isa"]
    if binding.f16_dot_sums_in_half():  # only a build for AVX512-FP16 sums in half precision
        assert buildinfo.build_isa_key() == "avx512fp16"


# --------------------------------------------------------------------------- against a live s2.cpp

def _live_exe() -> Path:
    tree = os.environ.get("PYGGML_S2CPP_DIR")
    if not tree:
        pytest.skip("PYGGML_S2CPP_DIR (an s2.cpp source tree with its ggml submodule) is not set")
    return s2cpp.build_harness(tree)


@pytest.mark.parametrize("frames", [12, 158])
def test_s2cpp_precision_matches_live_s2cpp(frames):
    exe = _live_exe()
    if s2cpp.isa_key(s2cpp.harness_info(exe)) != buildinfo.s2cpp_exactness()["isa"]:
        pytest.skip("the s2.cpp build and this ggml build differ in ISA")
    rng = np.random.default_rng(frames)
    codes = np.stack([rng.integers(0, s, frames) for s in (64,) + (32,) * 9]).astype(np.int32)
    audio = (0.3 * np.sin(np.arange(frames * 2048 - 100) * 0.05)).astype(np.float32)
    for threads in (1, 2):
        with pc.load(MODEL, backend="cpu", precision="s2cpp", n_threads=threads) as codec:
            for kind, data in (("decode", codes), ("encode", audio)):
                report = s2cpp.compare_with_s2cpp(codec, kind, data, exe=exe, model=MODEL, threads=threads)
                print(f"\n{kind} {frames} frames {threads} thread(s):\n{report.table()}")
                assert report.ok, report.verdict()


# --------------------------------------------------------------------------- bad input

def test_not_an_s2cpp_tree(tmp_path):
    with pytest.raises(s2cpp.S2cppError, match="not an s2.cpp source tree"):
        s2cpp.check_tree(tmp_path)
    with pytest.raises(s2cpp.S2cppError, match="not a directory"):
        s2cpp.check_tree(tmp_path / "absent")
    for name in s2cpp.REQUIRED_FILES[:-1]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    with pytest.raises(s2cpp.S2cppError, match="ggml submodule"):
        s2cpp.check_tree(tmp_path)


def test_harness_build_failure_is_reported(tmp_path):
    if not __import__("shutil").which("cmake"):
        pytest.skip("cmake not on PATH")
    for name in s2cpp.REQUIRED_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "ggml" / "CMakeLists.txt").write_text("message(FATAL_ERROR \"this ggml does not configure\")\n")
    with pytest.raises(s2cpp.S2cppError, match="building the s2.cpp harness failed") as err:
        s2cpp.build_harness(tmp_path, tmp_path / "build", timeout=300)
    assert "does not configure" in str(err.value)


def test_f32_model_is_refused_before_running(tiny_model):
    with pytest.raises(s2cpp.S2cppError, match="F32 conv weights"):
        s2cpp.check_model_for_s2cpp(tiny_model.f32_path)
    s2cpp.check_model_for_s2cpp(MODEL)  # F16: accepted


def _fake_exe(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "s2cpp_dump"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_harness_abort_hang_and_failure_are_errors(tmp_path):
    codes = np.zeros((10, 4), np.int32)
    exe = _fake_exe(tmp_path, "echo 'GGML_ASSERT(...) failed' >&2; kill -ABRT $$")
    with pytest.raises(s2cpp.S2cppError, match="aborted"):
        s2cpp.run_harness(exe, "decode", MODEL, codes)
    exe = _fake_exe(tmp_path, "sleep 30")
    with pytest.raises(s2cpp.S2cppError, match="ran over"):
        s2cpp.run_harness(exe, "decode", MODEL, codes, timeout=1)
    exe = _fake_exe(tmp_path, "echo 's2cpp_dump: s2.cpp could not load x' >&2; exit 3")
    with pytest.raises(s2cpp.S2cppError, match="could not load"):
        s2cpp.run_harness(exe, "decode", MODEL, codes)
    exe = _fake_exe(tmp_path, 'mkdir -p "$4"; echo \'{"kind": "decode", "self_check": false, "stages": []}\' > "$4/stages.json"')
    with pytest.raises(s2cpp.S2cppError, match="do not reproduce"):
        s2cpp.run_harness(exe, "decode", MODEL, codes)
    with pytest.raises(ValueError, match="kind"):
        s2cpp.run_harness(exe, "both", MODEL, codes)


def test_unreadable_golden(tmp_path):
    bad = tmp_path / "g.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(s2cpp.S2cppError, match="unreadable golden"):
        s2cpp.load_golden(bad)


def test_cli_s2cpp_compare(tmp_path, capsys):
    from pyggml_codec.cli.main import main

    assert main(["s2cpp-compare", str(tmp_path), "-m", str(MODEL)]) == 1
    assert "not an s2.cpp source tree" in capsys.readouterr().err
    assert main(["s2cpp-compare", str(tmp_path), "-m", str(tmp_path / "absent.gguf")]) == 1
    assert main(["s2cpp-compare", str(tmp_path), "-m", str(MODEL), "--frames", "0"]) == 2
    tree = os.environ.get("PYGGML_S2CPP_DIR")
    if tree:  # live: identical, exit 0, JSON written
        out = tmp_path / "r.json"
        assert main(["s2cpp-compare", tree, "-m", str(MODEL), "--frames", "20", "--json", str(out)]) == 0
        assert set(__import__("json").loads(out.read_text())) == {"decode", "encode"}


def test_build_exactness_is_reported(capsys):
    """doctor and backends state whether this build can give s2.cpp's bits; a LLAMAFILE build is
    refused the claim (and warns at load)."""
    from pyggml_codec.cli.main import main

    main(["backends"])
    out = capsys.readouterr().out
    exactness = buildinfo.s2cpp_exactness()
    assert "s2cpp precision vs s2.cpp: " + {True: "yes", False: "NO", None: "unverified"}[exactness["exact"]] in out
    assert buildinfo.build_info()["s2cpp_exact"] == exactness



def test_llamafile_build_warns(monkeypatch):
    """A LLAMAFILE build (simulated: ggml's own report patched) is reported as not exact and
    load(precision="s2cpp") warns with the fix; f32 does not warn."""
    import warnings

    monkeypatch.setattr(buildinfo.binding, "has_llamafile", lambda: True)
    exactness = buildinfo.s2cpp_exactness()
    assert exactness["exact"] is False and "-DGGML_LLAMAFILE=OFF" in exactness["reason"]
    with pytest.warns(pc.ExactnessWarning, match="LLAMAFILE on"):
        pc.load(MODEL, backend="cpu", precision="s2cpp").close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", pc.ExactnessWarning)
        pc.load(MODEL, backend="cpu", precision="f32").close()


def test_this_build_warns_exactly_when_it_is_not_exact():
    """Not simulated: this ggml build's own LLAMAFILE setting. On a LLAMAFILE=ON build (the
    CI's llamafile step builds one) load(precision="s2cpp") warns ExactnessWarning naming the
    fix; on an exact build it does not warn. f32 never warns."""
    import warnings

    exactness = buildinfo.s2cpp_exactness()
    print(f"llamafile {binding.has_llamafile()}, exactness {exactness}")
    if binding.has_llamafile():
        assert exactness["exact"] is False
        with pytest.warns(pc.ExactnessWarning, match="LLAMAFILE on"):
            pc.load(MODEL, backend="cpu", precision="s2cpp").close()
    elif exactness["exact"] is True:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pc.ExactnessWarning)
            pc.load(MODEL, backend="cpu", precision="s2cpp").close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", pc.ExactnessWarning)
        pc.load(MODEL, backend="cpu", precision="f32").close()
