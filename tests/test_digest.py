"""The demo model's outputs, bit for bit: a sha256 of the bytes of each result, recorded once per
platform (CPU, ggml build, BLAS) in tests/digests.json, so that a refactor that moves a single
bit of the f32 or s2cpp encode/decode fails here.

A platform without a record skips; record it (on a tree known to be right) with
``PYGGML_RECORD_DIGESTS=1 python -m pytest tests/test_digest.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import numpy as np
import pytest

import pyggml_codec
from pyggml_codec.backend import binding, buildinfo, kernels

from pyggml_codec.demo import build_demo_model, demo_signal

DIGESTS = Path(__file__).with_name("digests.json")
RECORD = os.environ.get("PYGGML_RECORD_DIGESTS") == "1"
SECONDS = 3.3  # 72 code frames: more than two of the CPU's 32-frame decode chunks, a partial last one


def platform_key() -> str:
    """What the bits depend on: the CPU, ggml's ISA key and every CPU feature its build reports, the
    BLAS and the kernel it picked by core, and how the compiled kernels were built (row-product width
    and F16C: a portable build, built without -march=native, sums in other orders).

    ggml-python compiles ggml for the installing machine (-march=native), and its f32 ops' bits follow
    that build: on one AVX512-FP16 Xeon, a build with AMX and AVX-VNNI and one without them decode the
    demo codes to different f32 bits (the same codes from encode, the same s2cpp bits). So the key
    names the build's features, not only its ISA class."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    blas = (f"{Path(kernels.BLAS.path).name}:{kernels.BLAS.describe().get('corename')}"
            if kernels.BLAS is not None else "no-blas")
    built = f"rowdot{kernels.OPS['rowdot']}:f16c{int(bool(kernels.OPS['f16c']))}" if kernels.AVAILABLE else "no-kernels"
    ggml = "+".join(sorted(name for name, value in binding.cpu_features().items() if value not in ("", "0")))
    return f"{platform.machine()}|{cpu}|{buildinfo.build_isa_key()}:{ggml}|{blas}|{built}"


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _outputs(path: Path, precision: str) -> dict[str, str]:
    with pyggml_codec.load(path, backend="cpu", precision=precision, n_threads=2) as codec:
        x = demo_signal(SECONDS, codec.config.sample_rate)
        codes = codec.encode(x)
        assert codes.dtype == np.int32 and codes.shape == (10, 72)
        out = {f"{precision}.encode": sha(codes), f"{precision}.decode": sha(codec.decode(codes))}
        codec.decode_chunk_frames = None
        out[f"{precision}.decode_one_graph"] = sha(codec.decode(codes))
        with codec.stream_decoder() as sd:
            out[f"{precision}.stream_decode_7"] = sha(np.concatenate(
                [sd.push(codes[:, i:i + 7]) for i in range(0, codes.shape[1], 7)]))
        return out


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo"), seed=0)


@pytest.mark.parametrize("precision", ["f32", "s2cpp"])
def test_demo_outputs_match_their_recorded_digests(demo_path, precision):
    got = _outputs(demo_path, precision)
    key = platform_key()
    recorded = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    if RECORD:
        recorded.setdefault(key, {}).update(got)
        DIGESTS.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    if key not in recorded:
        pytest.skip(f"no digests recorded for {key!r}; record them with PYGGML_RECORD_DIGESTS=1")
    want = {name: recorded[key].get(name) for name in got}
    assert got == want
