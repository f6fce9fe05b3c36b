"""f32 and s2cpp results bit for bit whatever the thread count: every compiled kernel splits its
work by shape alone (or computes each value as its row's own loop would), and OpenBLAS runs one
thread inside each of ggml's."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml_codec
from pyggml_codec.demo import build_demo_model, demo_signal


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory):
    return build_demo_model(tmp_path_factory.mktemp("demo"), seed=0)


def _results(path, precision: str, threads: int, codes: np.ndarray, x: np.ndarray) -> dict[str, np.ndarray]:
    with pyggml_codec.load(path, backend="cpu", precision=precision, n_threads=threads) as codec:
        out = {"encode": codec.encode(x), "decode": codec.decode(codes)}  # chunks of 32 frames: a stream
        codec.decode_chunk_frames = None
        out["decode_one_graph"] = codec.decode(codes)
        with codec.stream_decoder() as sd:
            out["stream_5"] = np.concatenate([sd.push(codes[:, i:i + 5]) for i in range(0, codes.shape[1], 5)])
        out["batch_3"] = np.concatenate(codec.decode_batch([codes[:, :40], codes[:, 10:50], codes[:, 30:]]))
        return out


@pytest.mark.parametrize("precision", ["f32", "s2cpp"])
def test_results_do_not_depend_on_the_thread_count(demo_path, precision):
    """The demo model (its decoder's values reach 250, so one flipped bit grows to 1e-4 at the
    output): 1, 3 and 5 threads against 2. An f32 chunked decode at 3 threads differed by 1.0e-4
    max abs while Snake and the bias-residual add split their rows by element count."""
    with pyggml_codec.load(demo_path, backend="cpu", n_threads=2) as codec:
        x = demo_signal(3.3, codec.config.sample_rate)
        codes = codec.encode(x)
    want = _results(demo_path, precision, 2, codes, x)
    for threads in (1, 3, 5):
        got = _results(demo_path, precision, threads, codes, x)
        err = {name: float(np.abs(got[name].astype(np.float64) - want[name]).max()) for name in want}
        print(f"{precision}, {threads} threads against 2: max abs {err}")
        assert all(v == 0.0 for v in err.values())
