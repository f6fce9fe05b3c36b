"""Streaming: exact stateful decode == one-shot, the C++ windowed schedule, chunked encode."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml_codec
from parity import max_abs, random_codes, rel_rms, report, signal
from pyggml_codec import stream_state
from pyggml_codec.backend import arena_attention, kernels
from pyggml_codec.backend.ggml_graph import BOUND_ALIGN
from pyggml_codec.plan import DECODE_CHUNK_FRAMES
from pyggml_codec.stream_state import append_state
from pyggml_codec.streaming import windowed_schedule

# f32 mode: the streamed graph computes the same sums as one pass except the Winograd convs'
# tiles, which fall differently in chunks, and the BLAS's products, whose sums change with the
# column count: 1-2e-7 per tap, 3-4e-7 Winograd (tiny), 6-7e-7 (full). The latent stage
# (attention by the fused op, row products at every width with AVX-512) matches bit for bit.
F32_MAX_ABS = 1e-6
# The full-size model's 6-7e-7 comes from more, longer sums whose rounding follows the BLAS
# kernel and the vector width: 3x that, so another machine's kernels do not fail a correct stream.
F32_FULL_MAX_ABS = 2e-6
# s2cpp mode rounds every conv input to F16 (ulp 2^-11 ~ 4.9e-4 relative), which turns
# those 1e-7 differences into ulp flips: the one-shot decode of a prefix already differs
# from the same frames of a longer one-shot decode by ~2e-4 (printed as the baseline).
S2CPP_MAX_ABS = 1e-3
T_FRAMES = 40  # > 8 (the tiny RVQ window), so KV history and its masking are exercised


def _chunks(codes: np.ndarray, sizes) -> list[np.ndarray]:
    out, start = [], 0
    for n in sizes:
        out.append(codes[:, start:start + n])
        start += n
    return [c for c in out if c.shape[1]]


def _random_split(total: int, seed: int, largest: int = 12) -> list[int]:
    rng = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < total:
        sizes.append(int(rng.integers(1, largest + 1)))
    sizes[-1] -= sum(sizes) - total
    return sizes


def _fixed(n: int, total: int = T_FRAMES) -> list[int]:
    return [n] * (total // n) + ([total % n] if total % n else [])


CHUNKINGS = {f"chunk{n}": _fixed(n) for n in (1, 3, 8, 4, 16)}
CHUNKINGS.update({f"random{s}": _random_split(T_FRAMES, s) for s in (0, 1)})


@pytest.fixture(scope="module")
def codec(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1) as c:
        yield c


def _streamed(codec, chunks) -> np.ndarray:
    spf = codec.config.samples_per_frame
    pieces = []
    with codec.stream_decoder() as sd:
        for c in chunks:
            pcm = sd.push(c)
            assert pcm.shape == (c.shape[1] * spf,) and pcm.dtype == np.float32
            pieces.append(pcm)
        assert sd.frames_pushed == sum(c.shape[1] for c in chunks)
        assert sd.flush().size == 0 and sd.frames_pushed == 0
    return np.concatenate(pieces)


# --------------------------------------------------------------------------- exact stream decode


@pytest.mark.parametrize("name", list(CHUNKINGS))
def test_stream_equals_one_shot_f32(codec, name):
    codes = random_codes(codec.config.quantizer.codebook_sizes, T_FRAMES, seed=7)
    want = codec.decode(codes)
    got = _streamed(codec, _chunks(codes, CHUNKINGS[name]))
    _, err = report(f"stream f32 {name} {CHUNKINGS[name]}", got, want)
    assert err <= F32_MAX_ABS


@pytest.mark.parametrize("name", ["chunk3", "random0"])
def test_stream_equals_one_shot_s2cpp(tiny_model, name):
    with pyggml_codec.load(tiny_model.f16_path, backend="cpu", precision="s2cpp", n_threads=1) as c:
        codes = random_codes(c.config.quantizer.codebook_sizes, T_FRAMES, seed=7)
        want = c.decode(codes)
        baseline = max(max_abs(c.decode(codes[:, :k]), want[:k * 2048]) for k in (17, 39))
        got = _streamed(c, _chunks(codes, CHUNKINGS[name]))
    _, err = report(f"stream s2cpp {name} (one-shot prefix baseline {baseline:.2e})", got, want)
    assert err <= S2CPP_MAX_ABS


def test_stream_decode_iterator_and_fused_path(codec, tiny_model):
    codes = random_codes(codec.config.quantizer.codebook_sizes, 20, seed=2)
    want = codec.decode(codes)
    got = np.concatenate(list(codec.stream_decode(_chunks(codes, [5, 1, 14]))))
    assert max_abs(got, want) <= F32_MAX_ABS
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", decode_path="fused", n_threads=1) as fused:
        got = np.concatenate(list(fused.stream_decode(_chunks(codes, [7, 13]))))
    assert max_abs(got, want) <= F32_MAX_ABS


def test_future_never_changes_past(codec):
    sizes = codec.config.quantizer.codebook_sizes
    past = random_codes(sizes, 20, seed=3)
    futures = [random_codes(sizes, 12, seed=s) for s in (4, 5)]
    outs = []
    for future in futures:
        with codec.stream_decoder() as sd:
            outs.append((sd.push(past[:, :11]), sd.push(past[:, 11:]), sd.push(future)))
    for a, b in zip(outs[0][:2], outs[1][:2]):
        assert np.array_equal(a, b)
    assert not np.allclose(outs[0][2], outs[1][2])
    one_shot = [codec.decode(np.concatenate([past, f], axis=1))[: 20 * 2048] for f in futures]
    assert max_abs(one_shot[0], one_shot[1]) <= F32_MAX_ABS
    assert max_abs(np.concatenate(outs[0][:2]), one_shot[0]) <= F32_MAX_ABS


def test_stream_validates_chunks(codec):
    with codec.stream_decoder() as sd:
        with pytest.raises(pyggml_codec.InputError):
            sd.push(np.zeros((3, 4), np.int64))
        with pytest.raises(pyggml_codec.InputError):
            sd.push(np.zeros((codec.config.n_codebooks, 0), np.int64))
        assert sd.frames_pushed == 0
        bad = random_codes(codec.config.quantizer.codebook_sizes, 3, seed=1)
        bad[0, 0] = -5
        with pytest.warns(RuntimeWarning, match="clamped"):
            sd.push(bad)
        assert sd.frames_pushed == 3


def test_a_push_past_the_one_shot_limit_runs_in_pieces(codec):
    """Documented as any n >= 1; it was refused with advice to use the stream decoder it was pushed to."""
    from pyggml_codec.inputs import MAX_DECODE_FRAMES

    codes = random_codes(codec.config.quantizer.codebook_sizes, MAX_DECODE_FRAMES + 5, seed=6)
    with codec.stream_decoder() as sd:
        got = sd.push(codes)
        assert sd.frames_pushed == codes.shape[1] and got.shape == (codes.shape[1] * codec.config.samples_per_frame,)
    want = _streamed(codec, [codes[:, :MAX_DECODE_FRAMES], codes[:, MAX_DECODE_FRAMES:]])
    assert np.array_equal(got, want)


def test_a_long_push_that_fails_midway_resets_the_stream(codec, monkeypatch):
    """Its first piece was committed; the stream starts again rather than continue from a state the
    caller never got the audio of. close() ends a stream as reset() does."""
    from pyggml_codec.inputs import MAX_DECODE_FRAMES

    codes = random_codes(codec.config.quantizer.codebook_sizes, MAX_DECODE_FRAMES + 3, seed=8)
    real, calls = codec.engine.decode_step, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("the second piece")
        return real(*args, **kwargs)

    with codec.stream_decoder() as sd:
        first = sd.push(codes[:, :4])
        monkeypatch.setattr(codec.engine, "decode_step", failing)
        with pytest.raises(MemoryError, match="the second piece"):
            sd.push(codes)
        monkeypatch.undo()
        assert sd.frames_pushed == 0
        assert np.array_equal(sd.push(codes[:, :4]), first)  # from the start again
        sd.close()
        assert sd.frames_pushed == 0


def test_stream_decoders_keep_their_codec_open(tiny_model):
    """A codec no one else holds stays open while its decoders live (it was closed by its finalizer)."""
    import gc

    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1) as c:
        sizes_codes = random_codes(c.config.quantizer.codebook_sizes, 6, seed=7)
        want = c.decode(sizes_codes)
    chunks = iter([sizes_codes[:, :2], sizes_codes[:, 2:]])
    stream = pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1).stream_decode(chunks)
    gc.collect()
    assert max_abs(np.concatenate(list(stream)), want) <= F32_MAX_ABS
    bsd = pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1).batch_stream_decoder(2)
    gc.collect()
    sid = bsd.join()
    assert bsd.push({sid: sizes_codes})[sid].shape == want.shape
    bsd.close()


def test_stream_decoder_checks_its_policy_when_made(codec):
    for make in (codec.stream_decoder, codec.batch_stream_decoder):
        with pytest.raises(ValueError, match="on_invalid_codes must be 'clamp' or 'raise', got 'x'"):
            make(on_invalid_codes="x")


@pytest.mark.parametrize("kv", ["arena", "arena-ggml", "concat"])
def test_kv_lowerings_stream_alike(tiny_model, kv, monkeypatch, require):
    """Both lowerings of a streamed attention's keys and values (host arena rows read and written
    in place, its attention by the fused op or by ggml's ops, or carried state concatenated in the
    graph) give the one-shot decode, one stream and a batched step, through the arena's moves (a
    one-frame stream moves its window back every ARENA_SLACK frames; a chunk longer than that grows
    the rows, moving the live window) and a reused slot. Metric: max abs against one graph; bound
    1e-6."""
    if kv == "arena-ggml":
        monkeypatch.setattr(arena_attention, "WINDOW_ATTENTION", False)
    elif kv == "arena":
        require("kernels", arena_attention.WINDOW_ATTENTION, "compiled kernels not built")
    fused, label = kv == "arena", kv
    kv = kv.split("-")[0]
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1, lowerings={"kv": kv}) as c:
        sizes = c.config.quantizer.codebook_sizes
        codes = random_codes(sizes, 150, seed=12)  # > ARENA_SLACK + window at one frame a chunk
        c.decode_chunk_frames = None
        want = c.decode(codes)
        got = _streamed(c, _chunks(codes, [1] * 70 + [80]))
        _, err = report(f"kv={label} one stream, 70 x 1 frame then 80", got, want)
        assert err <= F32_MAX_ABS
        assert c.lowerings["kv"] == kv
        if kv == "arena":
            assert c.lowerings["arena_attention"] == ("kernel" if fused else "ggml")
        with c.batch_stream_decoder(2) as bsd:
            a, b = bsd.join(), bsd.join()
            first = [bsd.push({a: codes[:, i:i + 1], b: codes[:, 60 + i:61 + i]}) for i in range(30)]
            bsd.leave(b)
            for rows in bsd._states._kv.values():  # what a stream that blew up would leave in its rows
                for arr in rows.arrays.values():
                    arr[rows.cap:2 * rows.cap] = np.nan
            c2 = bsd.join()  # b's slot again: its rows must not reach the new stream
            rest = [bsd.push({a: codes[:, 30 + i:31 + i], c2: codes[:, i:i + 1]}) for i in range(10)]
        got_a = np.concatenate([o[a] for o in first + rest])
        got_c = np.concatenate([o[c2] for o in rest])
        for name, g, w in (("a", got_a, want[:40 * 2048]), ("new stream in a reused slot", got_c, want[:10 * 2048])):
            _, err = report(f"kv={label} batched {name}", g, w)
            assert err <= F32_MAX_ABS


@pytest.mark.skipif(not (arena_attention.WINDOW_ATTENTION and kernels.ROWDOT
                          and kernels.rowdot_max_columns(0) > 1000 and kernels.rowdot_max_columns(1) > 1000),
                    reason="needs the fused attention and row products at every width (AVX-512 builds)")
def test_streamed_latent_is_decodes_bit_for_bit(tiny_model, monkeypatch):
    """The decoder's latent stage (codebooks, post-module transformer, upsampling) of a stream,
    at any chunking, one stream or batched, is decode()'s bit for bit: its products sum each
    output in one order whatever the column count, and its attention each query over its visible
    keys alone. Metric: np.array_equal of the latents (the audio is held to 1e-6 elsewhere)."""
    latents: list[np.ndarray] = []
    run = stream_state.StreamStates.run

    def recording(self, kind, *args, **kw):
        out, pending = run(self, kind, *args, **kw)
        if kind == "stream-latent":
            latents.append(out["latent"])
        return out, pending

    monkeypatch.setattr(stream_state.StreamStates, "run", recording)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=2) as c:
        codes = random_codes(c.config.quantizer.codebook_sizes, 70, seed=4)
        c.decode(codes)  # 70 > decode_chunk_frames: a stream of 32-frame chunks
        want = np.concatenate(latents, axis=-1)
        for sizes in ([1] * 70, [3] * 23 + [1], _random_split(70, 5)):
            latents.clear()
            with c.stream_decoder() as sd:
                for chunk in _chunks(codes, sizes):
                    sd.push(chunk)
            got = np.concatenate(latents, axis=-1)
            print(f"latent, chunks {sizes[:6]}...: max abs vs decode() {max_abs(got, want):.1e}")
            assert np.array_equal(got, want)
        latents.clear()
        with c.batch_stream_decoder(2) as bsd:
            a, b = bsd.join(), bsd.join()
            for i in range(0, 70, 2):
                bsd.push({a: codes[:, i:i + 2], b: codes[:, i:i + 2]})
        per = latents[0].shape[-1] // 2  # each step: stream a's columns, then b's
        got = np.concatenate([lat[..., :per] for lat in latents], axis=-1)
        print(f"latent, 2 streams in steps of 2: max abs vs decode() {max_abs(got, want):.1e}")
        assert np.array_equal(got, want)


@pytest.mark.slow
def test_stream_equals_one_shot_full(full_model):
    with pyggml_codec.load(full_model.f32_path, backend="cpu", n_threads=2) as c:
        codes = random_codes(c.config.quantizer.codebook_sizes, 150, seed=11)
        c.decode_chunk_frames = None  # the one-shot graph, not decode's own chunking
        want = c.decode(codes)
        for sizes in ([16] * 9 + [6], [1] * 5 + _random_split(145, 3, largest=24)):
            got = _streamed(c, _chunks(codes, sizes))
            _, err = report(f"full stream f32 {sizes[:8]}...", got, want)
            assert err <= F32_FULL_MAX_ABS


@pytest.mark.parametrize("precision", ["f32", "s2cpp"])
def test_long_decode_runs_in_chunks_with_bounded_memory(tiny_model, precision):
    """Past ``decode_chunk_frames`` the CPU split decode streams exactly; the compute buffer
    is the chunk's, whatever the length."""
    path = tiny_model.f32_path if precision == "f32" else tiny_model.f16_path
    with pyggml_codec.load(path, backend="cpu", precision=precision, n_threads=1) as c:
        # s2cpp decodes in one graph by default, as the C++ engine; chunks are asked for here
        assert c.decode_chunk_frames == (DECODE_CHUNK_FRAMES if precision == "f32" else None)
        codes = random_codes(c.config.quantizer.codebook_sizes, 150, seed=12)
        c.decode_chunk_frames = None
        want = c.decode(codes)
        one_shot = c.compute_bytes()["wave/150"]
        c.clear_cache()
        c.decode_chunk_frames = 16
        got = c.decode(codes)
        buffers = c.compute_bytes()
        assert set(buffers) == {"stream-latent/16", "stream-wave/16", "stream-latent/6", "stream-wave/6"}
        assert c.last_compute_s > 0
    _, err = report(f"chunked decode (16 frames) vs one-shot, {precision}", got, want)
    assert got.shape == want.shape
    assert err <= (F32_MAX_ABS if precision == "f32" else S2CPP_MAX_ABS)
    print(f"compute buffer: one-shot 150 frames {one_shot / 1e6:.1f} MB, chunks of 16 "
          f"{buffers['stream-wave/16'] / 1e6:.1f} MB")
    assert buffers["stream-wave/16"] < one_shot / 4


# --------------------------------------------------------------------------- C++ windowed schedule


def _check_rules(schedule, n_frames: int, history: int, holdback: int) -> None:
    emitted = 0
    for i, (ws, we, es, ee) in enumerate(schedule):
        final = i == len(schedule) - 1
        assert es == emitted and ee > es, "emitted ranges must be contiguous and non-empty"
        assert ws == max(0, es - history) and ws <= es and ee <= we
        assert ee == (n_frames if final else we - holdback)
        emitted = ee
    assert emitted == n_frames, "every frame is emitted exactly once"


def test_offline_schedule_matches_the_documented_table():
    s = windowed_schedule(400, 16, 144, 144)
    assert s[0] == (0, 160, 0, 16) and s[1] == (0, 176, 16, 32)
    assert (0, 304, 144, 160) in s and (16, 320, 160, 176) in s and (80, 384, 224, 240) in s
    assert s[-1] == (96, 400, 240, 400)
    assert all(we - ws == 304 for ws, we, _, _ in s[10:-1]), "steady window = 144 + 16 + 144"
    _check_rules(s, 400, 144, 144)
    assert windowed_schedule(10, 16, 144, 144) == [(0, 10, 0, 10)], "T <= stride: one decode"


def test_live_schedule_first_decode_and_low_latency():
    s = windowed_schedule(400, 4, 144, 144, live=True)
    assert s[:3] == [(0, 145, 0, 1), (0, 149, 1, 5), (0, 153, 5, 9)]
    _check_rules(s, 400, 144, 144)
    low = windowed_schedule(300, 1, 144, 0, live=True)
    assert low == windowed_schedule(300, 1, 144, 0) and len(low) == 300
    assert all(ee - es == 1 and we - ws <= 145 for ws, we, es, ee in low)
    _check_rules(low, 300, 144, 0)


@pytest.mark.parametrize("n,stride,history,holdback,live", [
    (37, 5, 8, 8, False), (37, 5, 8, 3, True), (50, 7, 0, 0, False), (9, 4, 20, 20, True), (64, 16, 24, 2, False),
])
def test_schedule_rules(n, stride, history, holdback, live):
    _check_rules(windowed_schedule(n, stride, history, holdback, live), n, history, holdback)


def test_decode_windowed(codec):
    codes = random_codes(codec.config.quantizer.codebook_sizes, 36, seed=5)
    want = codec.decode(codes)
    whole = codec.decode_windowed(codes, history=36)
    print(f"windowed with history >= T: max abs {max_abs(whole, want):.2e}")
    assert max_abs(whole, want) <= 1e-6
    # The tiny model's decode sees about 2 layers x 7 frames back: 24 frames of history
    # (the default, round_up_8(8 - 1 + 16)) cover it, 2 frames do not.
    got, schedule = codec.decode_windowed(codes, stride=8, return_schedule=True)
    _check_rules(schedule, 36, codec.config.streaming_history_frames, codec.config.streaming_history_frames)
    assert got.shape == want.shape
    assert max_abs(got, want) <= F32_MAX_ABS
    short = codec.decode_windowed(codes, stride=8, history=2, holdback=0)
    print(f"windowed history 24: {max_abs(got, want):.2e}; history 2: {max_abs(short, want):.2e}")
    assert max_abs(short, want) > 1e-4


# --------------------------------------------------------------------------- chunked encode


@pytest.mark.parametrize("pad_to,seconds,chunk_seconds", [("code_frame", 6.2, 1.0), ("frame_length", 2.0, 0.5)])
def test_encode_chunked_equals_one_shot(codec, pad_to, seconds, chunk_seconds):
    # 6.2 s is more than the encoder transformer's 512-latent-frame window (5.9 s); the
    # odd lengths leave a short last chunk, padded per policy (frame_length: 2 s + 77
    # samples = 173 latent frames, not a multiple of 4, so the downsample pads it).
    audio = signal(int(seconds * 44100) + 77, seed=4)
    want = codec.encode_stages(audio, pad_to=pad_to)
    got = codec.encode_chunked_details(audio, chunk_seconds=chunk_seconds, pad_to=pad_to, stages=True)
    lat_want = want.stages["latent"].reshape(got.stages["latent"].shape)
    lat, pre = rel_rms(got.stages["latent"], lat_want), rel_rms(got.stages["pre_module"], want.stages["pre_module"])
    flips = got.codes != want.codes
    print(f"encode_chunked {pad_to}: latent rel RMS {lat:.2e}, pre-VQ rel RMS {pre:.2e}, "
          f"{int(flips.sum())} codes differ")
    # measured: latent 3.8e-7 to 5.6e-7, pre-VQ 3.9e-7 to 5.7e-7 rel RMS (native and portable kernels)
    assert got.codes.shape == want.codes.shape and lat <= 5e-6 and pre <= 5e-6
    assert np.all(want.margins[flips] < 1e-4), "only near-ties may flip"


def test_encode_chunked_short_input_and_bounded_graphs(codec):
    audio = signal(3000, seed=9)
    codes, margins = (r := codec.encode_chunked_details(audio, chunk_seconds=1.0)).codes, r.margins
    assert np.array_equal(codes, codec.encode(audio)) and margins.shape == codes.shape
    codec.clear_cache()
    codec.encode_chunked(signal(2 * 44100, seed=1), chunk_seconds=0.25)
    keys = [k for k in codec.engine.cached_graphs() if k[0].startswith("stream-enc")]
    chunk = 5 * 2048  # round(0.25 s / 2048 samples) frames
    assert keys and all(k[1] <= chunk for k in keys), f"graphs are sized by the chunk, not the input: {keys}"
    with pytest.raises(pyggml_codec.InputError):
        codec.encode_chunked(np.zeros(0, np.float32))


@pytest.mark.parametrize("axis,n", [(0, 2), (0, 9), (2, 3), (2, 5)])
def test_append_state_keeps_the_last_entries(axis, n):
    old = np.arange(2 * 3 * 5, dtype=np.float32).reshape((5, 3, 2) if axis == 0 else (2, 3, 5))
    new = -np.arange(old.size // old.shape[axis] * n, dtype=np.float32).reshape(
        old.shape[:axis] + (n,) + old.shape[axis + 1:])
    want = np.take(np.concatenate([old, new], axis=axis), range(n, n + old.shape[axis]), axis=axis)
    got = append_state(old, new.reshape(-1), axis)
    assert got.shape == old.shape and np.array_equal(got, want)


def _poison_kept_rows(monkeypatch):
    """Every key/value row array given back to a pool is filled with NaN first: rows a new
    stream reads before writing would turn its audio to NaN."""
    give = stream_state.RowPool.give
    monkeypatch.setattr(stream_state.RowPool, "give",
                        lambda self, arrays: give(self, [a.fill(np.nan) or a for a in arrays]))


@pytest.fixture(params=["fused", "full"])
def any_attention(request, tiny_model):
    """The tiny f32 codec with the fused attention op (reads the visible rows alone) and with
    attention over full windows (reads masked rows too: they must be finite)."""
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1,
                           lowerings={"attention": request.param}) as c:
        yield c


def test_closed_streams_rows_serve_the_next_stream(any_attention, monkeypatch):
    """A closed stream decoder's key/value rows go back to the engine, the next new stream takes
    them, and its audio is the same as on fresh rows. Metric: np.array_equal of the audio; the
    kept rows were NaN, so any row read before written would show."""
    codec = any_attention
    _poison_kept_rows(monkeypatch)
    pool = codec.engine.row_pool
    codes = random_codes(codec.config.quantizer.codebook_sizes, 12, seed=31)
    other = random_codes(codec.config.quantizer.codebook_sizes, 12, seed=32)
    codec.clear_cache()
    assert pool.nbytes == 0
    with codec.stream_decoder() as sd:
        want = [sd.push(codes[:, i:i + 3]) for i in range(0, 12, 3)]
    kept = pool.nbytes
    print(f"rows kept after close: {kept} bytes")
    assert kept > 0
    with codec.stream_decoder() as sd:
        sd.push(other[:, :5])  # another stream's keys and values in the rows it gives back
    with codec.stream_decoder() as sd:
        got = [sd.push(codes[:, i:i + 3]) for i in range(0, 12, 3)]
        assert pool.nbytes == 0, "the new stream took the kept rows"
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert pool.nbytes == kept


def test_batches_and_chunked_decodes_give_their_rows_back(any_attention, monkeypatch):
    """Batched streams, a chunked decode and a chunked encode give their rows back when done, and
    what reuses them computes as on fresh rows. Metric: np.array_equal against the runs on fresh
    rows."""
    codec = any_attention
    _poison_kept_rows(monkeypatch)
    pool = codec.engine.row_pool
    sizes = codec.config.quantizer.codebook_sizes
    items = [random_codes(sizes, 6, seed=40 + i) for i in range(2)]
    long = random_codes(sizes, DECODE_CHUNK_FRAMES + 5, seed=42)

    def batched():
        with codec.batch_stream_decoder(2) as b:
            sids = [b.join() for _ in items]
            outs = [b.push({s: x[:, i:i + 2] for s, x in zip(sids, items)}) for i in range(0, 6, 2)]
        return [np.concatenate([o[s] for o in outs]) for s in sids]

    audio = signal(3 * 44100, seed=43)

    def chunked_encode():
        return [codec.encode_chunked(audio, chunk_seconds=0.5)]

    for run in (batched, lambda: [codec.decode(long)], chunked_encode):
        codec.clear_cache()
        want = run()
        assert pool.nbytes > 0, f"{run} kept no rows"
        got = run()
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
    codec.clear_cache()
    assert pool.nbytes == 0


def test_row_pool_keeps_the_newest_that_fit_and_zeroes_what_it_gives():
    pool = stream_state.RowPool(max_bytes=3 * 4 * 4 + 20)  # one array of 3 x 4 float32
    a, b = stream_state.aligned_zeros(3, 4), stream_state.aligned_zeros(3, 4)
    b.fill(np.nan)
    pool.give([a, b])  # b takes a's room
    assert pool.nbytes == b.nbytes
    got = pool.take(3, 4)
    assert got is b and not got.any() and pool.nbytes == 0
    other = pool.take(2, 4)  # no kept array of that shape: a new one
    assert other.shape == (2, 4) and not other.any() and other.ctypes.data % BOUND_ALIGN == 0
    pool.give([a])
    pool.give([other])  # a new shape pushes the old one out: an unused shape holds no room
    assert pool.take(3, 4) is not a and pool.take(2, 4) is other
    pool.give([stream_state.aligned_zeros(5, 4)])  # larger than the pool: not kept
    assert pool.nbytes == 0
    pool.give([a])
    pool.clear()
    assert pool.nbytes == 0
    pool.close()  # the engine closed: nothing is kept any more
    pool.give([stream_state.aligned_zeros(1, 4)])
    assert pool.nbytes == 0


def test_a_stream_closed_after_its_codec_leaves_nothing_kept(tiny_model):
    c = pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1)
    sd = c.stream_decoder()
    sd.push(random_codes(c.config.quantizer.codebook_sizes, 3, seed=33))
    pool = c.engine.row_pool
    c.close()
    sd.close()
    assert pool.nbytes == 0
