"""``pyggml-codec bench-backends`` with two real backends: the CPU and the one under test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


def test_bench_backends_compares_the_device_with_the_cpu(gpu_backend, tiny_model, tmp_path):
    """Both rows run; the device's deltas against the CPU are what the parity tests allow:
    f32 decode rel RMS <= 5e-6 (measured 4.8e-7 on lavapipe) and the codes of the 0.5 s bench
    signal all equal (measured 100 %: F32 products move the latent by ~6e-7, far below its
    11 frames' margins; bench counts near-ties too, so a flip here is a real change to look
    at). The table is printed for the CI log."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pyggml_codec", "bench-backends", "-m", str(tiny_model.f32_path),
                           "--seconds", "0.5", "--repeats", "2", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=900, check=False)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    rows = {r["backend"]: r for r in result["rows"]}
    assert set(rows) >= {"cpu", gpu_backend} and all(r["ok"] for r in rows.values())
    gpu = rows[gpu_backend]
    assert gpu["device"] != "CPU" and gpu["products"] == "f32" and rows["cpu"]["products"] == "f32"
    assert gpu["decode_path"] == "fused" and rows["cpu"]["decode_path"] == "split"
    assert gpu["decode"]["compute_bytes"] > 0 and gpu["encode"]["compute_bytes"] > 0
    print(f"{gpu_backend}: decode rel RMS {gpu['decode_rel_rms']:.3e}, codes agreement {gpu['codes_agreement']:.2%}")
    assert gpu["decode_rel_rms"] <= 5e-6 and gpu["codes_agreement"] == 1.0
    assert gpu["lowerings"] and "lowerings" in proc.stdout
