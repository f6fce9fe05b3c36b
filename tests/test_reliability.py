"""Reliability: broken model files, bad inputs, graph-builder sweeps, fuzzing, threads, lifetime.

Anything that could reach a GGML_ASSERT (an ``abort()`` no ``try`` survives) runs in a child
process (``child.py``) that names the case it died in; pure-Python checks run in-process.
See docs/RELIABILITY.md for the table of inputs and the errors they give.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import struct
import tracemalloc
import warnings

import broken_gguf as bg
import child
import gguf_craft as gc
import gguf_fuzz
import numpy as np
import pytest
import reliability_scripts as scripts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyggml_codec
from pyggml_codec import ClosedError, ConfigError, InputError, ModelFileError
from pyggml_codec.model.convert import write_merged_fixture
from pyggml_codec.model.gguf_file import ModelFile
from pyggml_codec.inputs import MAX_DECODE_FRAMES, MAX_ENCODE_SECONDS

SR, SPF = 44100, 2048  # tiny model: sample rate, samples per code frame
SIZES = [64] + [32] * 9  # tiny model codebook sizes
# Absurd sizes: Python lines a refusal may run, counted with sys.settrace (measured: 570 for a
# header count, 16431 for a tensor's dimensions, 28247 for n_layer 2^32-1, the largest; the
# bound is about 10x that). Past it the child's tracer stops the load, so a loop sized by the
# absurd count fails here in well under a second instead of hanging.
ABSURD_LINES = 300_000
ABSURD_LINE_CAP = ABSURD_LINES + 1
TRUNCATED = r"truncated|too short|holds at most|claims \d+ (entries|bytes)|outside the data"


@pytest.fixture(scope="module")
def template(tiny_model) -> gc.Gguf:
    return gc.read(tiny_model.f32_path)


@pytest.fixture(scope="module")
def codec(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, "cpu", n_threads=1) as c:
        yield c


def _noise(n: int, seed: int = 0) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def _codes(t: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, s, t) for s in SIZES]).astype(np.int32)


def _data_end(layout: gc.Layout, g: gc.Gguf) -> int:
    """The shortest valid length: the end of the last tensor's bytes."""
    def offset(t: gc.TensorEntry) -> int:
        return struct.unpack_from("<Q", layout.data, layout.offsets[f"ti:{t.name}:offset"])[0]

    return max(layout.offsets["data"] + offset(t) + len(t.data) for t in g.tensors)


# --------------------------------------------------------------------------- broken model files


@pytest.mark.parametrize("case", [c for c in bg.CASES if not c.absurd], ids=lambda c: c.id)
def test_broken_file_is_refused_with_reason(case, template, tmp_path):
    path = tmp_path / f"{case.id}.gguf"
    path.write_bytes(case.make(gc.small() if case.small else template))
    with pytest.raises(case.error, match=case.match) as info:
        pyggml_codec.load(path, "cpu", n_threads=1)
    if not isinstance(info.value, ConfigError):  # file-level errors name the file
        assert str(path) in str(info.value)


def test_absurd_sizes_are_refused_in_bounded_memory_and_time(template, tiny_model, tmp_path):
    """Huge counts and lengths: refused before anything sized by them is allocated or looped over."""
    cases = [c for c in bg.CASES if c.absurd]
    todo = []
    for c in cases:
        path = tmp_path / f"{c.id}.gguf"
        path.write_bytes(c.make(gc.small() if c.small else template))
        todo.append([c.id, str(path)])
    results = child.run_cases(scripts.ABSURD_SCRIPT, json.dumps(todo), str(tiny_model.f32_path), str(ABSURD_LINE_CAP))
    for c in cases:
        r = results[c.id]
        assert r["raised"] and c.error.__name__ in r["mro"], f"{c.id}: {r}"
        assert re.search(c.match, r["message"]), f"{c.id}: {r['message']!r} lacks {c.match!r}"
        # memory and work (Python lines run), not time: a loop sized by the absurd count hits the cap
        assert r["peak_mb"] < 8 and r["lines"] <= ABSURD_LINES, f"{c.id}: {r['peak_mb']:.1f} MB, {r['lines']} lines"
    print("peak traced MB per case:", {c.id: round(results[c.id]["peak_mb"], 2) for c in cases})
    print("Python lines per case:", {c.id: results[c.id]["lines"] for c in cases})
    print("seconds per case (not asserted):", {c.id: round(results[c.id]["seconds"], 4) for c in cases})
    assert results["rss"]["growth_mb"] < 64, results["rss"]


def test_truncation_at_every_byte_of_a_small_file():
    g = gc.small()
    layout = gc.write(g)
    end = _data_end(layout, g)
    for n in range(len(layout.data) + 1):
        if n < end:
            with pytest.raises(ModelFileError, match=TRUNCATED):
                ModelFile.from_buffer(layout.data[:n])
        else:
            assert set(ModelFile.from_buffer(layout.data[:n]).tensors) == {"a", "b", "c.d"}


def test_truncation_through_the_tiny_file_header(template):
    """Every byte of the fixed header, the key-values and the first tensor infos, then a stride of
    13 through the rest of the tensor infos (parser only, in-process)."""
    layout = gc.write(template)
    header_end = layout.offsets["data"]
    positions = list(range(3072)) + list(range(3072, header_end + 1, 13))
    for n in positions:
        with pytest.raises(ModelFileError, match=TRUNCATED):
            ModelFile.from_buffer(layout.data[:n])


@pytest.mark.slow
def test_truncation_at_every_byte_of_the_tiny_file_header(template):
    """The same at every one of the ~28 k header positions (about 30 s)."""
    layout = gc.write(template)
    for n in range(layout.offsets["data"] + 1):
        with pytest.raises(ModelFileError, match=TRUNCATED):
            ModelFile.from_buffer(layout.data[:n])


def test_truncation_through_the_tiny_file_data(template, tmp_path):
    """A stride through the tensor data, through the public loader on real files."""
    layout = gc.write(template)
    end = _data_end(layout, template)
    path = tmp_path / "cut.gguf"
    for n in np.linspace(layout.offsets["data"], end - 1, 40).astype(int):
        path.write_bytes(layout.data[:n])
        with pytest.raises(ModelFileError, match="truncated file or offset outside the data"):
            pyggml_codec.load(path, "cpu", n_threads=1)
    path.write_bytes(layout.data[:end])  # the trailing alignment padding is optional
    pyggml_codec.load(path, "cpu", n_threads=1).close()


def test_valid_variants_still_load(template, tiny_model, tmp_path, codec):
    """Positive controls: the rewritten file, a 64-byte-aligned layout, a merged file, a host reader."""
    from gguf import GGUFReader

    assert gc.write(template).data == tiny_model.f32_path.read_bytes()  # the writer is byte-exact
    g = template.copy()
    g.kvs.insert(1, gc.KV("general.alignment", gc.UINT32, 64))
    g.alignment = 64
    (tmp_path / "a64.gguf").write_bytes(gc.write(g).data)
    merged = write_merged_fixture(tiny_model.f32_path, tmp_path / "merged.gguf")
    codes = _codes(3)
    want = codec.decode(codes)
    for source in (tmp_path / "a64.gguf", merged, GGUFReader(str(tiny_model.f32_path))):
        with pyggml_codec.load(source, "cpu", n_threads=1) as c:
            np.testing.assert_array_equal(c.decode(codes), want)


# --------------------------------------------------------------------------- fuzzing


@pytest.fixture(scope="module")
def fuzz_seed(tiny_model, template) -> tuple[bytes, int]:
    """The valid file and its header length, once a child has survived 40 mutations of it."""
    data = tiny_model.f32_path.read_bytes()
    header_end = gc.write(template).offsets["data"]
    results = child.run_cases(scripts.FUZZ_GUARD, str(tiny_model.f32_path), str(header_end), "40")
    bad = {k: v for k, v in results.items() if v not in ("refused", "loaded")}
    assert not bad, f"mutations that raised something other than ModelFileError: {bad}"
    return data, header_end


_FUZZ_OUTCOMES: dict[str, int] = {}


def _edit_strategy(header_end: int, size: int):
    header_pos = st.integers(0, header_end - 1)
    return st.lists(st.one_of(
        st.tuples(st.just("byte"), header_pos, st.integers(0, 255)),
        st.tuples(st.just("word"), header_pos, st.sampled_from(gguf_fuzz.WORD_FORMATS),
                  st.sampled_from(gguf_fuzz.BOUNDARY)),
        st.tuples(st.just("byte"), st.integers(header_end, size - 1), st.integers(0, 255)),
        st.tuples(st.just("truncate"), st.integers(0, size - 1)),
    ), min_size=1, max_size=4)


def test_fuzzed_files_load_or_raise_model_file_error(fuzz_seed):
    data, header_end = fuzz_seed

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(_edit_strategy(header_end, len(data)))
    def body(edits):
        outcome = gguf_fuzz.load_or_refuse(gguf_fuzz.apply(data, edits))
        _FUZZ_OUTCOMES[outcome] = _FUZZ_OUTCOMES.get(outcome, 0) + 1

    body()
    print("fuzz outcomes:", _FUZZ_OUTCOMES)
    assert _FUZZ_OUTCOMES.get("refused", 0) > 50 and _FUZZ_OUTCOMES.get("loaded", 0) > 10, _FUZZ_OUTCOMES


# --------------------------------------------------------------------------- audio inputs


@pytest.mark.parametrize("audio, match", [
    (np.array([0.1, np.nan, 0.2, np.inf], np.float32), "2 NaN or Inf samples"),
    (np.full(100, -np.inf), "100 NaN or Inf samples"),
    (np.zeros(0, np.float32), "audio is empty"),
    (np.zeros((1, 0), np.float32), "audio is empty"),
    (np.zeros((0, 100), np.float32), "audio has 0 channels"),
    (np.zeros((2, 100), np.float32), "audio has 2 channels"),
    (np.float32(0.5), r"must be 1-D \(n,\) or 2-D"),
    (np.zeros((1, 1, 100), np.float32), r"got shape \(1, 1, 100\)"),
    (np.zeros(100, bool), "got dtype bool"),
    (np.zeros(100, np.complex64), "got dtype complex64"),
    (np.array([0.1, None, 0.2], object), "got dtype object"),
    (np.zeros(100, np.uint8), "got dtype uint8"),
    (np.zeros(100, np.float16), "got dtype float16"),
    (np.zeros(100, np.int32), "got dtype int32"),
    (["a", "b"], "got dtype <U1"),
    ([[0.1, 0.2], [0.3]], "cannot be read as an array"),
    (None, "got dtype object"),
    (np.full(100, 1e300), "100 samples beyond float32's range"),  # were cast to Inf: every code 0
    (np.full(4096, 3e38, np.float32), r"the encoder's output has \d+ NaN or Inf values"),  # overflows inside
])
def test_bad_audio_raises_input_error(codec, audio, match):
    with pytest.raises(InputError, match=match):
        codec.encode(audio)


@pytest.mark.parametrize("rate, match", [(22050, "differs from the model's 44100"),
                                         (44100.5, "whole number of Hz"), ("44100", "whole number of Hz")])
def test_bad_sample_rate_raises_input_error(codec, rate, match):
    with pytest.raises(InputError, match=match):
        codec.encode(_noise(100), sample_rate=rate)


@pytest.mark.parametrize("n, match", [(0, r"in 1\.\.512"), (513, r"in 1\.\.512"), (65536, r"in 1\.\.512"),
                                      (1.5, "must be a whole number"), (True, "must be a whole number"),
                                      ("2", "must be a whole number"), (float("nan"), "must be a whole number")])
def test_bad_thread_counts_raise_value_error(tiny_model, codec, n, match):
    """65536 threads crashed the process inside ggml's thread pool; 1.5 silently ran on 1."""
    with pytest.raises(ValueError, match=match):
        pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=n)
    before = codec.n_threads
    with pytest.raises(ValueError, match=match):
        codec.n_threads = n
    assert codec.n_threads == before
    codec.n_threads = 2.0  # a whole number, as a float
    assert codec.n_threads == 2 and isinstance(codec.n_threads, int)
    codec.n_threads = before


def test_bad_call_arguments_name_the_argument(tiny_model, codec):
    """Arguments that ran as something else (a stride of 1.9 as 1, "COL2IM_1D" as its letters) or failed
    with an unrelated message."""
    codes = np.zeros((10, 3), np.int32)
    for kwargs, match in [({"stride": 1.9}, "stride must be a whole number >= 1, got 1.9"),
                          ({"stride": 0}, "stride must be >= 1, got 0"),
                          ({"history": -1}, "history must be >= 0"), ({"holdback": "x"}, "holdback must be a whole"),
                          ({"stride": float("inf")}, "stride must be a whole number"),
                          ({"stride": float("nan")}, "stride must be a whole number")]:
        with pytest.raises(ValueError, match=match):
            codec.decode_windowed(codes, **kwargs)
    with pytest.raises(ValueError, match="frames_per_step must be a whole number >= 1, got 'x'"):
        codec.decode_batch([codes], frames_per_step="x")
    with pytest.raises(TypeError, match="lowerings must be a dict of lowering name -> choice, got str"):
        pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings="x")
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", cpu_ops="col2im_1d") as one:
        assert one.engine.model.backend.cpu_ops == frozenset({"COL2IM_1D"})
    assert np.array_equal(codec.decode_windowed(codes, stride=2.0), codec.decode_windowed(codes, stride=2))


def test_audio_too_long_is_refused_before_any_copy(codec):
    n = int(MAX_ENCODE_SECONDS * SR) + 1
    for audio in (np.broadcast_to(np.float32(0), (n,)), np.broadcast_to(np.int16(0), (2, n))):
        tracemalloc.start()
        with pytest.raises(InputError, match=f"exceeds the one-shot encode limit of {MAX_ENCODE_SECONDS:.0f} s"):
            codec.encode(audio, mix="mean")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 1 << 20, f"refusing {n} samples allocated {peak / 2**20:.1f} MB"


def test_odd_but_valid_audio_layouts_encode_like_plain_float32(codec):
    x = _noise(3 * SPF + 5, seed=3)
    want = codec.encode(x)
    strided = np.repeat(x, 2)[::2]  # non-contiguous view
    readonly = x.copy()
    readonly.flags.writeable = False
    fortran = np.asfortranarray(x[None, :])
    for variant in (strided, readonly, fortran, x.astype(np.float64), list(x.astype(np.float64)), x.astype(">f4"),
                    x.astype(">f8")):  # big-endian floats were refused ("got dtype >f4")
        np.testing.assert_array_equal(codec.encode(variant), want)
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int16)
    np.testing.assert_array_equal(codec.encode(pcm), codec.encode(pcm.astype(np.float32) / 32768))
    np.testing.assert_array_equal(codec.encode(pcm.astype(">i2")), codec.encode(pcm))
    stereo = np.stack([x, 0.5 * x])
    np.testing.assert_array_equal(codec.encode(stereo, mix="mean"), codec.encode(stereo.mean(axis=0)))
    assert codec.encode(x, sample_rate=44100.0).shape == want.shape


def test_one_sample_encodes_to_one_frame(codec):
    for x in (np.array([0.25], np.float32), np.array([[0.25]], np.float32)):
        codes = codec.encode(x)
        assert codes.shape == (10, 1) and codes.dtype == np.int32


# --------------------------------------------------------------------------- code inputs


@pytest.mark.parametrize("codes, match", [
    (np.zeros((10, 4), np.float32), "codes must be integers, got dtype float32"),
    (np.zeros((10, 4), bool), "got dtype bool"),
    (np.zeros((10, 4), object), "got dtype object"),
    (np.zeros((9, 4), np.int32), r"shape \(10, T\) or \(1, 10, T\), got \(9, 4\)"),
    (np.zeros(10, np.int32), r"got \(10,\)"),
    (np.zeros((2, 10, 4), np.int32), r"got \(2, 10, 4\)"),
    (np.zeros((10, 0), np.int32), r"codes are empty \(T = 0\)"),
    ([[1, 2], [3]], "cannot be read as an array"),
])
def test_bad_codes_raise_input_error(codec, codes, match):
    with pytest.raises(InputError, match=match):
        codec.decode(codes)


def test_one_shot_decode_limit_applies_only_without_chunking(codec):
    too_long = np.zeros((10, MAX_DECODE_FRAMES + 1), np.int32)
    match = f"exceed the one-shot decode limit of {MAX_DECODE_FRAMES}"
    with pytest.raises(InputError, match=match):
        codec.decode_stages(too_long)  # stages need the one-shot graph
    saved = codec.decode_chunk_frames
    try:
        codec.decode_chunk_frames = None
        with pytest.raises(InputError, match=match):
            codec.decode(too_long)
        for bad in (0, -3, 2.5, True, "64"):
            codec.decode_chunk_frames = bad
            with pytest.raises(ValueError, match="decode_chunk_frames must be None or an int >= 1"):
                codec.decode(_codes(4, seed=1))
    finally:
        codec.decode_chunk_frames = saved


def test_out_of_range_codes_are_clamped_with_counts_or_refused(codec):
    codes = _codes(4, seed=1).astype(np.int64)
    codes[0, :2] = [-1, -(2**40)]  # two negatives in codebook 0
    codes[4, 1:4] = [32, 99, 2**40]  # three too large in codebook 4
    clipped = np.clip(codes, 0, np.array(SIZES)[:, None] - 1)
    with pytest.warns(RuntimeWarning, match=r"clamped out-of-range codes \(codebook 0: 2, codebook 4: 3\)"):
        audio = codec.decode(codes)
    np.testing.assert_array_equal(audio, codec.decode(clipped))
    with pytest.raises(InputError, match=r"out of range \(codebook 0: 2, codebook 4: 3\)"):
        codec.decode(codes, on_invalid_codes="raise")
    huge = np.full((10, 2), 2**64 - 1, np.uint64)  # must clamp high, not wrap to -1
    top = np.repeat(np.array(SIZES)[:, None] - 1, 2, axis=1)
    with pytest.warns(RuntimeWarning, match="codebook 9: 2"):
        np.testing.assert_array_equal(codec.decode(huge), codec.decode(top))


def test_valid_code_layouts_decode_alike(codec):
    codes = _codes(3, seed=2)
    want = codec.decode(codes)
    assert want.shape == (3 * SPF,) and want.dtype == np.float32
    ro = codes.copy()
    ro.flags.writeable = False
    for variant in (codes[None], codes.astype(np.int8), codes.astype(np.uint16), np.asfortranarray(codes), ro,
                    codes.tolist(), np.repeat(codes, 2, axis=1)[:, ::2]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # in range: no clamp warning
            np.testing.assert_array_equal(codec.decode(variant), want)


# --------------------------------------------------------------------------- graph-builder sweep


def test_graph_builders_survive_odd_lengths(tiny_model):
    results = child.run_cases(scripts.SWEEP_SCRIPT, str(tiny_model.f32_path), str(tiny_model.f16_path))
    assert len(results) == 2 * 2 * (2 * 10 + 2 * 5)
    for case_id, r in results.items():
        assert "raised" not in r, f"{case_id}: {r}"
        if case_id.startswith("encode/"):
            n = int(case_id.rsplit("=", 1)[1])
            assert r["shape"] == [10, math.ceil(n / SPF)] and r["dtype"] == "int32", (case_id, r)
            assert r["min"] >= 0 and all(m < s for m, s in zip(r["row_max"], SIZES)), (case_id, r)
        else:
            t = int(case_id.rsplit("=", 1)[1])
            assert r == {"shape": [t * SPF], "dtype": "float32", "finite": True}, (case_id, r)


# --------------------------------------------------------------------------- threads and lifetime


def test_one_codec_shared_by_threads(tiny_model):
    """4 threads on one codec give the serial results; close() from another thread mid-run is safe.

    In a child: without the codec's lock this segfaults (measured), it does not just differ."""
    results = child.run_cases(scripts.THREADS_SCRIPT, str(tiny_model.f32_path))
    shared, closing = results["four_threads"], results["close_while_busy"]
    assert shared == {"calls": 48, "wrong": []}, shared
    assert set(closing) <= {"equal", "closed"} and closing.get("closed") == 3, closing


def _call_with_placeholders(fn):
    """Call ``fn`` with None for each required argument; drain it if it returns an iterator."""
    params = inspect.signature(fn).parameters.values()
    args = [None for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    result = fn(*args)
    if hasattr(result, "__next__"):
        next(result)
    return result


def test_every_public_member_raises_closed_error_after_close(tiny_model):
    c = pyggml_codec.load(tiny_model.f32_path, "cpu", n_threads=1)
    c.decode(_codes(2))
    for _ in range(3):
        c.close()  # idempotent
    checked = []
    for name, member in inspect.getmembers(type(c)):
        if name.startswith("_") or name == "close":
            continue
        try:
            getattr(c, name) if isinstance(member, property) else _call_with_placeholders(getattr(c, name))
        except ClosedError:
            checked.append(name)
            continue
        except Exception as exc:  # noqa: BLE001 - any other exception is the failure reported
            pytest.fail(f"Codec.{name} after close() raised {type(exc).__name__}: {exc}, not ClosedError")
        pytest.fail(f"Codec.{name} after close() did not raise ClosedError")
    with pytest.raises(ClosedError):
        c.n_threads = 1
    assert {"encode", "decode", "config", "sample_rate", "parts", "backend_name", "clear_cache"} <= set(checked)
    with pyggml_codec.load(tiny_model.f32_path, "cpu", n_threads=1) as c2:
        pass
    with pytest.raises(ClosedError, match="closed"):
        c2.encode(_noise(10))


def test_load_encode_decode_close_cycles_do_not_leak(tiny_model, template, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(gc.write(template).data[:-1000])  # parses everything, then fails on the data
    growth = child.run_cases(scripts.RSS_SCRIPT, str(tiny_model.f32_path), str(broken), "200", "20")["growth"]
    print(f"RSS growth over cycles 20..200: {growth['rss_mb']:.1f} MB (from {growth['base_mb']:.1f} MB)")
    assert "raised" not in growth, growth
    assert growth["rss_mb"] < 30, growth
    assert growth["fds"] <= 0, growth


def test_keyboard_interrupt_during_encode_leaves_codec_usable(tiny_model):
    results = child.run_cases(scripts.INTERRUPT_SCRIPT, str(tiny_model.f32_path))
    print("interrupt runs:", results)
    assert len(results) == 4 and all(r.get("same") for r in results.values()), results
    assert all(r["outcome"] == "interrupted" for r in results.values()), results
