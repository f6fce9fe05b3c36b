"""Many streams in one graph: each stream's audio equals decoding it alone, streams join and leave,
pushes carry different frame counts, and bad input or a failed step moves no stream."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml_codec
from parity import max_abs, random_codes, report
from pyggml_codec.backend.ggml_graph import Graph

# f32: the same sums as one stream's graph except where Winograd tiles and the BLAS/ggml choice
# of a product fall differently with the packed length; measured 3-4e-7 (tiny), like one stream's.
F32_MAX_ABS = 1e-6
F32_FULL_MAX_ABS = 2e-6  # the full-size model's bound (test_streaming.py)
S2CPP_MAX_ABS = 1e-3  # F16 conv inputs turn those differences into ulp flips (test_streaming.py)


@pytest.fixture(scope="module")
def codec(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1) as c:
        yield c


def _one_shot(codec, codes: np.ndarray) -> np.ndarray:
    chunk, codec.decode_chunk_frames = codec.decode_chunk_frames, None
    try:
        return codec.decode(codes)
    finally:
        codec.decode_chunk_frames = chunk


def _schedule(lengths, seed: int, starts=None, largest: int = 4):
    """Steps of {item: frames}: item i joins at step starts[i], then pushes 1..largest frames
    at a time (sometimes skipping a step), until its codes run out."""
    rng = np.random.default_rng(seed)
    starts = starts or [0] * len(lengths)
    done, steps, step = [0] * len(lengths), [], 0
    while any(d < n for d, n in zip(done, lengths)):
        push = {}
        for i, n in enumerate(lengths):
            if step >= starts[i] and done[i] < n and rng.random() < 0.85:
                push[i] = min(n - done[i], int(rng.integers(1, largest + 1)))
                done[i] += push[i]
        if push:
            steps.append(push)
        step += 1
    return steps


def _run(bsd, items, steps) -> list[np.ndarray]:
    """Push ``steps`` (item -> frames); items join at their first push and leave after their last."""
    sids, done, pieces = {}, [0] * len(items), [[] for _ in items]
    bsd.groups_seen = set()
    for push in steps:
        for i in push:
            if i not in sids:
                sids[i] = bsd.join()
        out = bsd.push({sids[i]: items[i][:, done[i]:done[i] + n] for i, n in push.items()})
        assert set(out) == {sids[i] for i in push}
        assert sorted(bsd.last_groups) == sorted((n, list(push.values()).count(n)) for n in set(push.values()))
        bsd.groups_seen.update(bsd.last_groups)
        for i, n in push.items():
            assert out[sids[i]].shape == (n * 2048,) and out[sids[i]].dtype == np.float32
            pieces[i].append(out[sids[i]])
            done[i] += n
            if done[i] == items[i].shape[1]:
                bsd.leave(sids[i])
    return [np.concatenate(p) for p in pieces]


@pytest.mark.parametrize("seed", [0, 1])
def test_streams_join_leave_and_equal_decoding_alone(codec, seed):
    sizes = codec.config.quantizer.codebook_sizes
    lengths = [30, 17, 25, 9]  # > 8 frames (the tiny RVQ window): carried keys are masked and cut
    items = [random_codes(sizes, n, seed=100 * seed + i) for i, n in enumerate(lengths)]
    steps = _schedule(lengths, seed, starts=[0, 0, 3, 11], largest=2)
    assert any(len(set(s.values())) > 1 for s in steps), "some steps mix frame counts"
    with codec.batch_stream_decoder(4) as bsd:
        got = _run(bsd, items, steps)
        assert bsd.streams == ()
        assert max(b for _, b in bsd.groups_seen) >= 3, "some steps ran 3+ streams in one graph"
    for i, (g, x) in enumerate(zip(got, items)):
        _, err = report(f"batched stream {i} ({x.shape[1]} frames) vs one-shot", g, _one_shot(codec, x))
        assert err <= F32_MAX_ABS


def test_a_step_that_grows_the_rows_keeps_an_earlier_groups_rows(codec):
    """A step whose later group pushes more frames than the key/value rows have room for
    (ARENA_SLACK past the window) grows them; the rows an earlier group of the same step wrote,
    not yet committed, move with them. Metric: max abs of each stream against decoding it alone,
    bound F32_MAX_ABS."""
    sizes = codec.config.quantizer.codebook_sizes
    a, b = random_codes(sizes, 12, seed=50), random_codes(sizes, 80, seed=51)
    with codec.batch_stream_decoder(2) as bsd:
        got = _run(bsd, [a, b], [{0: 2, 1: 2}, {0: 1, 1: 70}, {0: 9, 1: 8}])
        assert bsd.groups_seen >= {(1, 1), (70, 1)}
    for i, (g, x) in enumerate(zip(got, [a, b])):
        _, err = report(f"stream {i} across a step that grew the rows", g, _one_shot(codec, x))
        assert err <= F32_MAX_ABS


@pytest.mark.parametrize("conv", ["winograd", "taps"])
def test_a_stream_sees_only_its_own_codes(tiny_model, conv):
    """Two runs that differ only in stream 1's codes give stream 0 the same audio, bit for bit,
    with per-tap convs and with Winograd's (each stream's tiles are its own: conv_wino segments).
    Metric: max abs of stream 0's difference; tolerance 0."""
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1, lowerings={"conv": conv}) as c:
        sizes = c.config.quantizer.codebook_sizes
        a, b1, b2 = (random_codes(sizes, 12, seed=s) for s in (7, 8, 9))
        outs = []
        for b in (b1, b2):
            with c.batch_stream_decoder(2) as bsd:
                outs.append(_run(bsd, [a, b], [{0: 3, 1: 3}, {0: 1, 1: 1}, {0: 8, 1: 8}]))
    moved = max_abs(outs[0][0], outs[1][0])
    print(f"{conv}: stream 0 moved by {moved:.1e} when stream 1's codes changed")
    assert moved == 0.0
    assert max_abs(outs[0][1], outs[1][1]) > 1e-3


def test_steady_group_feeds_its_states_back_as_they_were_stacked(codec):
    """A group of streams that runs again as it was gets the last step's batched state outputs as
    its inputs (no split and stack): the same bits as re-stacking every stream's state, through
    steps that leave a stream out and split the group by frame count. Metric: bit equality of
    every stream's audio."""
    from pyggml_codec.stream_state import StreamStates

    sizes = codec.config.quantizer.codebook_sizes
    items = [random_codes(sizes, 12, seed=80 + i) for i in range(3)]
    steps = [{0: 1, 1: 1, 2: 1}] * 5 + [{0: 1, 1: 1}] * 3 + [{0: 2, 1: 2, 2: 4}] + [{0: 1, 1: 1, 2: 1}] * 2
    outs, fed_back = [], []
    for cache in (True, False):
        real_run = StreamStates.run

        def run(self, *args, **kw):
            if not cache:
                self._stacked.clear()
            fed_back.append(sum(1 for key in self._stacked if key[0] == args[0]))
            return real_run(self, *args, **kw)

        StreamStates.run = run
        try:
            with codec.batch_stream_decoder(3) as bsd:
                outs.append(_run(bsd, items, steps))
        finally:
            StreamStates.run = real_run
    assert all(np.array_equal(a, b) for a, b in zip(*outs))
    assert max(fed_back) > 0


def test_decode_batch_equals_decode(codec):
    sizes = codec.config.quantizer.codebook_sizes
    items = [random_codes(sizes, n, seed=30 + n) for n in (40, 23, 1, 7)]
    for frames_per_step in (None, 5, 1000):
        got = codec.decode_batch(items, frames_per_step=frames_per_step)
        assert [g.shape for g in got] == [(x.shape[1] * 2048,) for x in items]
        for g, x in zip(got, items):
            _, err = report(f"decode_batch ({frames_per_step} frames a step) item of {x.shape[1]}", g,
                            _one_shot(codec, x))
            assert err <= F32_MAX_ABS
    assert codec.decode_batch([]) == []
    with pytest.raises(pyggml_codec.InputError, match="item 1"):
        codec.decode_batch([items[0], np.zeros((3, 4), np.int64)])


def test_fused_and_s2cpp_paths(tiny_model):
    for path, precision, bound in (("fused", "f32", F32_MAX_ABS), ("split", "s2cpp", S2CPP_MAX_ABS)):
        file = tiny_model.f32_path if precision == "f32" else tiny_model.f16_path
        with pyggml_codec.load(file, backend="cpu", n_threads=1, decode_path=path, precision=precision) as c:
            sizes = c.config.quantizer.codebook_sizes
            items = [random_codes(sizes, n, seed=40 + n) for n in (14, 11)]
            with c.batch_stream_decoder(2) as bsd:
                got = _run(bsd, items, _schedule([14, 11], seed=3))
            for g, x in zip(got, items):
                c.decode_chunk_frames = None
                _, err = report(f"batched {path} {precision}", g, c.decode(x))
                assert err <= bound


def test_bad_input_moves_no_stream(codec):
    """Every kind of bad push raises an InputError naming the stream, and no stream moves:
    the streams then finish exactly as if the bad pushes had never happened."""
    sizes = codec.config.quantizer.codebook_sizes
    items = [random_codes(sizes, 16, seed=50 + i) for i in range(3)]
    bad_range = items[1][:, 4:6].copy()
    bad_range[3, 1] = sizes[3] + 7
    with codec.batch_stream_decoder(3, on_invalid_codes="raise") as bsd:
        a, b, c = (bsd.join() for _ in range(3))
        first = bsd.push({a: items[0][:, :4], b: items[1][:, :4], c: items[2][:, :4]})
        bsd.leave(c)
        for chunk, match in ((np.zeros((3, 2), np.int64), "shape"), (items[1][:, 4:6].astype(np.float32), "integers"),
                             (bad_range, "out of range"), (items[1][:, 4:4], "empty")):
            with pytest.raises(pyggml_codec.InputError, match=f"stream {b}: .*{match}"):
                bsd.push({a: items[0][:, 4:6], b: chunk})
        with pytest.raises(pyggml_codec.InputError, match=f"stream {c} has left"):
            bsd.push({a: items[0][:, 4:6], c: items[2][:, 4:6]})
        with pytest.raises(pyggml_codec.InputError, match="no stream 99"):
            bsd.push({a: items[0][:, 4:6], 99: items[2][:, 4:6]})
        with pytest.raises(pyggml_codec.InputError, match="no stream True"):  # was taken as stream 1
            bsd.push({True: items[1][:, 4:6]})
        bsd.join()
        with pytest.raises(pyggml_codec.InputError, match="at most 3 streams"):
            bsd.join()
        assert bsd.frames(a) == bsd.frames(b) == 4
        rest = bsd.push({a: items[0][:, 4:], b: items[1][:, 4:]})
    for i, sid in ((0, a), (1, b)):
        got = np.concatenate([first[sid], rest[sid]])
        assert max_abs(got, _one_shot(codec, items[i])) <= F32_MAX_ABS
    with pytest.raises(ValueError, match="max_streams"):
        codec.batch_stream_decoder(0)


def test_failed_step_moves_no_stream(codec, monkeypatch):
    """A compute that fails in the last graph of a step (after others ran) commits nothing."""
    sizes = codec.config.quantizer.codebook_sizes
    items = [random_codes(sizes, 10, seed=60 + i) for i in range(2)]
    want = [_one_shot(codec, x) for x in items]
    real_run = Graph.run
    calls = {"n": 0}

    def failing_run(self, fresh=None, bound=None):
        if "latent" in (fresh or {}):  # the decoder stage of the step, after the latent stage ran
            calls["n"] += 1
            raise pyggml_codec.GraphError("injected failure")
        return real_run(self, fresh, bound)

    with codec.batch_stream_decoder(2) as bsd:
        s0, s1 = bsd.join(), bsd.join()
        first = bsd.push({s0: items[0][:, :3], s1: items[1][:, :5]})
        monkeypatch.setattr(Graph, "run", failing_run)
        with pytest.raises(pyggml_codec.GraphError):
            bsd.push({s0: items[0][:, 3:], s1: items[1][:, 5:]})
        monkeypatch.setattr(Graph, "run", real_run)
        assert calls["n"] == 1 and bsd.frames(s0) == 3 and bsd.frames(s1) == 5
        rest = bsd.push({s0: items[0][:, 3:], s1: items[1][:, 5:]})
    for sid, w in ((s0, want[0]), (s1, want[1])):
        assert max_abs(np.concatenate([first[sid], rest[sid]]), w) <= F32_MAX_ABS


@pytest.mark.slow
def test_batched_streams_full(full_model):
    with pyggml_codec.load(full_model.f32_path, backend="cpu", n_threads=2, parts="decode") as c:
        sizes = c.config.quantizer.codebook_sizes
        items = [random_codes(sizes, n, seed=70 + n) for n in (40, 33, 20)]
        with c.batch_stream_decoder(3) as bsd:
            got = _run(bsd, items, _schedule([40, 33, 20], seed=5, starts=[0, 2, 4], largest=3))
        for g, x in zip(got, items):
            _, err = report(f"full batched stream of {x.shape[1]}", g, _one_shot(c, x))
            assert err <= F32_FULL_MAX_ABS
