"""Stage dumps, their comparison against upstream's, and the compare / bench-backends commands.

Reference dumps come from ``tools/reference_dump.py`` (upstream torch modules, same stage
names) on the session's tiny model (``tiny_model`` = ``--preset tiny --seed 0``).
Tolerance for ours vs upstream: rel RMS <= 5e-6 per stage (F32_REL_RMS): the f32 precision's stages
measure 1.1e-7 to 7.4e-7 against upstream's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import pyggml_codec
from devscripts import load_script
from parity import random_codes, signal
from pyggml_codec.io import dumps as diag
from pyggml_codec.cli.diagnostics import register_cli
from pyggml_codec.diagnostics.compare import CompareError, CompareUsageError, compare
from pyggml_codec.io.codefiles import CodeFile, write_codes

REPO = Path(__file__).resolve().parents[2]
# per-stage rel RMS of the f32 dumps against the reference: at most 7.4e-7 (decode) and 6.8e-7 (encode)
F32_REL_RMS = 5e-6
N_FRAMES = 7
N_SAMPLES = 13230  # 0.3 s: not a multiple of the 2048-sample code frame, so padding shows


def _load_tool():
    return load_script("tools/reference_dump.py")


@pytest.fixture(scope="module")
def codec(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", precision="f32") as c:
        yield c


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tiny_model, codec):
    """Our dumps and the reference dumps of the same codes and audio."""
    d = tmp_path_factory.mktemp("diag")
    tool = _load_tool()
    codes = random_codes(codec.config.quantizer.codebook_sizes, N_FRAMES, seed=5)
    audio = signal(N_SAMPLES, seed=6)
    out = {"dir": d, "codes": codes, "audio": audio}
    out["wave"] = codec.dump_decode(codes, d / "ours_dec.npz")
    out["enc_codes"] = codec.dump_encode(audio, d / "ours_enc.npz")
    tool.make_reference_dump(tiny_model.model, codes, "decode", d / "ref_dec.npz")
    tool.make_reference_dump(tiny_model.model, audio, "encode", d / "ref_enc.npz")
    return out


# --------------------------------------------------------------------------- dump contents


def test_decode_dump_names_and_shapes(ws, codec, tiny_model):
    dump = diag.load_dump(ws["dir"] / "ours_dec.npz")
    n = N_FRAMES * 2048
    want = {"codes": (10, N_FRAMES), "dec.vq_sum": (64, N_FRAMES), "dec.post_module": (64, N_FRAMES),
            "dec.upsample0": (64, 2 * N_FRAMES), "dec.upsample1": (64, 4 * N_FRAMES), "dec.latent": (64, 4 * N_FRAMES),
            "dec.block1": (32, 32 * N_FRAMES), "dec.block2": (16, 256 * N_FRAMES), "dec.block3": (8, 1024 * N_FRAMES),
            "dec.block4": (4, n), "dec.pre_tanh": (1, n), "audio": (n,)}
    got = {k: tuple(v.shape) for k, v in dump.stages.items()}
    print(got)
    assert list(got) == list(want) and got == want
    assert diag.decode_stage_shapes(codec.config, N_FRAMES) == want
    meta = dump.meta
    assert meta["stage_order"] == list(want) and meta["kind"] == "decode"
    assert (meta["backend"], meta["precision"], meta["library_version"]) == ("cpu", "f32", pyggml_codec.__version__)
    assert meta["model_file"] == str(tiny_model.f32_path)
    assert np.array_equal(dump.stages["audio"], ws["wave"])
    assert np.max(np.abs(dump.stages["audio"] - np.tanh(dump.stages["dec.pre_tanh"][0]))) < 1e-6  # pre_tanh is it


def test_encode_dump_names_and_shapes(ws, codec):
    dump = diag.load_dump(ws["dir"] / "ours_enc.npz")
    t = math.ceil(N_SAMPLES / 2048)  # 7 frames; padded to 14336 samples
    want = {"audio": (N_SAMPLES,), "enc.block1": (8, 7168), "enc.block2": (16, 1792), "enc.block3": (32, 224),
            "enc.block4": (64, 28), "latent": (64, 28), "enc.downsample0": (64, 14), "enc.downsample1": (64, t),
            "pre_module": (64, t)}
    for i in range(10):
        want[f"enc.vq{i}.residual"] = (64, t)
        want[f"enc.vq{i}.codes"] = (t,)
    want["codes"] = (10, t)
    got = {k: tuple(v.shape) for k, v in dump.stages.items()}
    assert list(got) == list(want) and got == want
    assert diag.encode_stage_shapes(codec.config, N_SAMPLES) == want
    # time-major codec stages are transposed into (C, T), not reshaped
    native = codec.encode_stages(ws["audio"]).stages
    assert np.array_equal(dump.stages["pre_module"], native["pre_module"].T)
    assert np.array_equal(dump.stages["enc.vq3.residual"], native["enc.vq3.residual"].T)
    assert np.array_equal(dump.stages["enc.vq0.residual"], dump.stages["pre_module"])
    assert np.array_equal(dump.stages["codes"], ws["enc_codes"])
    assert np.array_equal(np.stack([dump.stages[f"enc.vq{i}.codes"] for i in range(10)]), ws["enc_codes"])


def test_dump_rejects_an_undocumented_shape():
    with pytest.raises(diag.DumpError, match="dec.vq_sum"):
        diag.to_dump_layout("dec.vq_sum", np.zeros((64, 7), np.float32), (64, 7))  # codec gives (T, C)
    assert diag.to_dump_layout("dec.vq_sum", np.zeros(64, np.float32), (64, 1)).shape == (64, 1)  # 1 frame


# --------------------------------------------------------------------------- comparing dumps


def test_compare_dump_with_itself_is_all_zeros(ws):
    report = compare(ws["dir"] / "ours_enc.npz", ws["dir"] / "ours_enc.npz")
    print(report.table())
    assert report.ok and report.first_failure is None
    for s in report.stages:
        assert s.metrics["max_abs"] == 0 and s.metrics["rel_rms"] == 0 and s.metrics["snr_db"] == math.inf
        assert s.kind != "codes" or s.metrics["agreement"] == [1.0] * len(s.metrics["agreement"])
    assert json.loads(report.to_json())["stages"][1]["metrics"]["snr_db"] == "inf"


@pytest.mark.parametrize("direction", ["dec", "enc"])
def test_ours_matches_reference_per_stage(ws, direction):
    ref, ours = ws["dir"] / f"ref_{direction}.npz", ws["dir"] / f"ours_{direction}.npz"
    report = compare(ref, ours, {"rel_rms": F32_REL_RMS})
    print(report.table())
    assert diag.load_dump(ref).stage_order == diag.load_dump(ours).stage_order
    assert not report.only_in_a and not report.only_in_b
    assert report.ok, report.verdict()


def test_perturbed_stage_is_named_first(ws):
    ours = diag.load_dump(ws["dir"] / "ours_dec.npz")
    bad = {k: v.copy() for k, v in ours.stages.items()}
    rng = np.random.default_rng(0)
    x = bad["dec.upsample1"]
    bad["dec.upsample1"] = x + 3e-3 * np.sqrt(np.mean(x**2)) * rng.standard_normal(x.shape).astype(np.float32)
    diag.save_dump(ws["dir"] / "bad_dec.npz", bad, ours.meta)
    report = compare(ws["dir"] / "ref_dec.npz", ws["dir"] / "bad_dec.npz")
    print(report.table())
    assert not report.ok and report.first_failure == "dec.upsample1"
    assert [s.name for s in report.stages if not s.ok] == ["dec.upsample1"]
    row = next(s for s in report.stages if s.name == "dec.upsample1")
    assert 2e-3 < row.metrics["rel_rms"] < 4e-3 and "rel_rms" in row.violations[0]
    assert "FAIL: first stage past tolerance: dec.upsample1" in report.table()
    # overrides: per stage (exact name or pattern) and global
    assert compare(ws["dir"] / "ref_dec.npz", bad, {"dec.upsample*": {"rel_rms": 1e-2}}).ok
    assert compare(ws["dir"] / "ref_dec.npz", bad, {"rel_rms": 1e-2}).ok
    with pytest.raises(ValueError, match="unknown tolerance metric"):
        compare(bad, bad, {"dec.latent": {"rms": 1.0}})


def test_perturbed_code_stage_is_named_first(ws):
    ours = diag.load_dump(ws["dir"] / "ours_enc.npz")
    bad = dict(ours.stages)
    bad["enc.vq3.codes"] = bad["enc.vq3.codes"].copy()
    bad["enc.vq3.codes"][2] += 1
    report = compare(ws["dir"] / "ref_enc.npz", bad)
    print(report.verdict())
    assert report.first_failure == "enc.vq3.codes"
    row = next(s for s in report.stages if s.name == "enc.vq3.codes")
    assert row.metrics["agreement"] == [pytest.approx(6 / 7)]


# --------------------------------------------------------------------------- code and audio files


def test_compare_code_files(ws, tmp_path):
    codes = ws["enc_codes"]
    a = write_codes(tmp_path / "a.npz", CodeFile(codes))
    np.save(tmp_path / "b.npy", codes.astype(np.int64))
    assert compare(a, tmp_path / "b.npy").ok
    flipped = codes.copy()
    flipped[2, 3] = (flipped[2, 3] + 1) % 32
    np.save(tmp_path / "c.npy", flipped)
    report = compare(a, tmp_path / "c.npy")
    print(report.table())
    agree = report.stages[0].metrics["agreement"]
    assert report.first_failure == "codes" and agree[2] == pytest.approx(6 / 7)
    assert agree[:2] + agree[3:] == [1.0] * 9 and "codebook(s) [2]" in report.verdict()
    assert compare(a, tmp_path / "c.npy", {"agreement": 0.8}).ok
    np.save(tmp_path / "short.npy", codes[:, :-1])
    assert compare(a, tmp_path / "short.npy").stages[0].kind == "shape"


def test_compare_audio_files(ws, tmp_path):
    ref = diag.load_dump(ws["dir"] / "ref_dec.npz").stages["audio"]
    sf.write(tmp_path / "ref.wav", ref, 44100, subtype="FLOAT")
    sf.write(tmp_path / "ours.wav", ws["wave"], 44100, subtype="FLOAT")
    sf.write(tmp_path / "loud.wav", ws["wave"] * 1.01, 44100, subtype="FLOAT")
    sf.write(tmp_path / "other_rate.wav", ws["wave"], 22050, subtype="FLOAT")
    report = compare(tmp_path / "ref.wav", tmp_path / "ours.wav", {"rel_rms": F32_REL_RMS})
    print(report.table())
    assert report.ok
    loud = compare(tmp_path / "ref.wav", tmp_path / "loud.wav")
    assert loud.first_failure == "audio" and loud.stages[0].metrics["rel_rms"] == pytest.approx(1e-2, rel=1e-3)
    assert loud.stages[0].metrics["snr_db"] == pytest.approx(40.0, abs=0.1)
    with pytest.raises(CompareError, match="sample rates differ"):
        compare(tmp_path / "ref.wav", tmp_path / "other_rate.wav")
    with pytest.raises(CompareUsageError):
        compare(tmp_path / "ref.wav", ws["dir"] / "ours_dec.npz")


# --------------------------------------------------------------------------- command line


def _own_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyggml-codec")
    register_cli(parser.add_subparsers(dest="command", required=True))
    return parser


def test_register_cli_compare_exit_codes(ws, tmp_path, capsys):
    parser = _own_parser()

    def run(*argv) -> int:
        args = parser.parse_args([str(a) for a in argv])
        return args.func(args)

    ref, ours = ws["dir"] / "ref_dec.npz", ws["dir"] / "ours_dec.npz"
    assert run("compare", ref, ours, "--rel-rms", str(F32_REL_RMS), "--json", tmp_path / "r.json") == 0
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True
    assert run("compare", ref, ours, "--rel-rms", "1e-9") == 1
    assert "FAIL: first stage past tolerance: dec.vq_sum" in capsys.readouterr().out
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    assert run("compare", ref, tmp_path / "junk.npz") == 1
    err = capsys.readouterr().err
    assert err.startswith("pyggml-codec: error: ") and err.count("\n") == 1
    assert run("compare", ref, tmp_path / "missing.npz") == 1
    sf.write(tmp_path / "x.wav", ws["wave"], 44100)
    assert run("compare", ref, tmp_path / "x.wav") == 2
    with pytest.raises(SystemExit) as exc:
        run("compare", ref, ours, "--rel-rms", "-1")
    assert exc.value.code == 2


def _cli_registered() -> bool:
    if not (REPO / "pyggml_codec" / "__main__.py").is_file():
        return False
    from pyggml_codec.cli import main as cli_main

    sub = next(a for a in cli_main.get_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {"compare", "bench-backends"} <= set(sub.choices)


def _cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pyggml_codec", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_cli_compare_and_bench_through_main(ws, tiny_model, tmp_path):
    if not _cli_registered():
        pytest.skip("pyggml_codec/__main__.py is missing or does not register compare/bench-backends")
    ref, ours = ws["dir"] / "ref_enc.npz", ws["dir"] / "ours_enc.npz"
    assert _cli("compare", ref, ours, "--rel-rms", str(F32_REL_RMS)).returncode == 0
    failed = _cli("compare", ref, ours, "--rel-rms", "1e-12", "--json", tmp_path / "r.json")
    assert failed.returncode == 1, failed.stderr
    assert json.loads((tmp_path / "r.json").read_text())["first_failure"] == "enc.block1"
    (tmp_path / "junk.npy").write_bytes(b"garbage")
    bad = _cli("compare", tmp_path / "junk.npy", tmp_path / "junk.npy")
    assert bad.returncode == 1 and bad.stderr.startswith("pyggml-codec: error: ") and bad.stderr.count("\n") == 1
    np.save(tmp_path / "codes.npy", ws["enc_codes"].astype(np.int64))
    kinds = _cli("compare", ref, tmp_path / "codes.npy")  # a dump vs a code file: usage error
    assert kinds.returncode == 2 and "cannot compare a stage dump" in kinds.stderr
    assert _cli("compare", ref).returncode == 2
    bench = _cli("bench-backends", "-m", tiny_model.f32_path, "--seconds", "0.1", "--repeats", "1",
                 "--threads", "1", "--json", tmp_path / "b.json")
    print(bench.stdout)
    assert bench.returncode == 0, bench.stderr
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert rows[0]["backend"] == "cpu" and rows[0]["ok"]


def test_bench_backends_has_the_cpu_row(tiny_model):
    """The CPU row's deltas are against itself (0 by construction); a second CPU run's deltas
    against the first row's outputs must be 0 as well (the CPU is deterministic: another load,
    another compute, the same bits), and against outputs made to differ (audio scaled by
    1 + 1e-3, one code changed) the same metric must show the difference."""
    from pyggml_codec.diagnostics import bench
    from pyggml_codec.diagnostics.bench import bench_backends

    result = bench_backends(tiny_model.f32_path, seconds=0.1, repeats=2, n_threads=1)
    table = result.table()
    print(table)
    cpu = result.row("cpu")
    assert result.ok and cpu.ok and result.rows[0] is cpu
    assert any(line.startswith("cpu ") for line in table.splitlines())
    assert cpu.decode_path == "split" and cpu.lowerings
    ref = bench._run_backend("cpu", tiny_model.f32_path, 0.1, None, 1, "f32", 1)[1]
    again, _ = bench._run_backend("cpu", tiny_model.f32_path, 0.1, ref, 1, "f32", 1)
    assert again.decode_rel_rms == 0 and again.decode_max_abs == 0 and again.codes_agreement == 1.0
    codes = ref["codes"].copy()
    codes[0, 0] = (codes[0, 0] + 1) % 64
    moved = {**ref, "audio": ref["audio"] * np.float32(1 + 1e-3), "codes": codes}
    off, _ = bench._run_backend("cpu", tiny_model.f32_path, 0.1, moved, 1, "f32", 1)
    print(f"against moved outputs: decode rel RMS {off.decode_rel_rms:.3e}, codes agreement {off.codes_agreement}")
    # the decode ran on the moved codes, so its audio differs from the scaled reference by more than the scale
    assert off.decode_rel_rms > 5e-4 and off.codes_agreement == pytest.approx(1 - 1 / codes.shape[1])
    for t in (cpu.encode, cpu.decode):
        assert t.cold_s > 0 and t.warm_s > 0 and t.compute_bytes > 0 and t.graphs
    assert set(k.split(":")[0] for k in cpu.encode.graphs) == {"enc", "enc2"}
    assert set(k.split(":")[0] for k in cpu.decode.graphs) == {"latent", "wave"}
    if pyggml_codec.available_backends() == ["cpu"]:
        assert len(result.rows) == 1 and "only the CPU backend" in result.note
    json.loads(result.to_json())


def test_dump_methods_return_what_encode_and_decode_return(tiny_model, tmp_path):
    """codec.dump_decode / dump_encode write dumps and return decode's audio and encode's codes."""
    import pyggml_codec

    rng = np.random.default_rng(11)
    codes = np.stack([rng.integers(0, s, 9) for s in (64,) + (32,) * 9])
    x = (0.2 * rng.standard_normal(5000)).astype(np.float32)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu") as codec:
        audio = codec.dump_decode(codes, tmp_path / "d.npz")
        np.testing.assert_array_equal(audio, codec.decode(codes))
        got = codec.dump_encode(x, tmp_path / "e.npz")
        np.testing.assert_array_equal(got, codec.encode(x))
        with pytest.raises(TypeError):
            codec.decode(codes, return_stages=True)  # one return type: stages come from decode_stages
        # references from separate calls, written through the dump layout by hand
        ref_audio, dec_stages = codec.decode_stages(codes)
        diag.save_dump(tmp_path / "d_ref.npz", diag.decode_dump(dec_stages, codes, ref_audio, codec.config), {})
        enc = codec.encode_stages(x)
        diag.save_dump(tmp_path / "e_ref.npz", diag.encode_dump(enc.stages, x, enc.codes, codec.config), {})
        codec.dump_decode((codes + 1) % 32, tmp_path / "d_other.npz")
    for name in ("d", "e"):
        got, ref = diag.load_dump(tmp_path / f"{name}.npz"), diag.load_dump(tmp_path / f"{name}_ref.npz")
        assert got.stage_order == ref.stage_order and len(ref.stages) > 3
        for stage, arr in ref.stages.items():
            np.testing.assert_array_equal(got.stages[stage], arr, err_msg=stage)
        assert compare(tmp_path / f"{name}_ref.npz", tmp_path / f"{name}.npz", {"rel_rms": 0.0}).ok
    other = compare(tmp_path / "d_ref.npz", tmp_path / "d_other.npz")  # the comparison can fail
    print(other.table())
    assert not other.ok
