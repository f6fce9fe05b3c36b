"""Write the golden .s2voice files: voice profiles saved by the C++ engine's own writer.

    python tools/make_s2voice_golden.py --s2cpp S2CPP_TREE

Compiles the harness's s2voice_tool.cpp with s2.cpp's own src/s2_voice.cpp (VoiceProfile::save
and ::load; no ggml needed) from the tree, has it save each profile of :data:`CASES`, reads each
file back with the engine's reader, and writes tests/golden/s2voice/: ``<case>.s2voice``,
``codes.npz`` (each case's int32 codes) and ``profiles.json`` (the other fields and each file's
sha256). It then checks that this library reads every file exactly and writes the same bytes.

The functions here (build, write and read with s2.cpp) are also what the live test uses
(tests/io/test_s2voice_engine.py, with PYGGML_S2CPP_DIR set).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pyggml_codec.io.codefiles import S2VoiceFile
from pyggml_codec.diagnostics import s2cpp

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "s2voice"
TOOL_SOURCE = s2cpp.HARNESS_SOURCE / "s2voice_tool.cpp"
TREE_FILES = ("src/s2_voice.cpp", "include/s2_voice.h", "third_party/filesystem.hpp")
# name -> (num_codebooks, T, sample_rate, codebook_size, transcript, code range)
CASES = {
    "t1_empty": (10, 1, 44100, 4096, "", (0, 4096)),
    "t7_ascii": (10, 7, 44100, 4096, "The quick brown fox jumps over the lazy dog.", (0, 4096)),
    "t7_utf8": (10, 7, 44100, 4096, "Grüße aus Köln — 你好，世界 🎙", (0, 4096)),
    "t250_empty": (10, 250, 44100, 4096, "", (0, 1024)),
    "t250_utf8": (10, 250, 44100, 4096, "<|speaker:0|>Voix de référence : « bonjour », dit-elle. こんにちは。", (0, 1024)),
    "t7_extremes": (2, 7, 24000, 1024, "x", (-(2**31), 2**31)),  # sign and byte order of every field
}


def case_codes(name: str) -> np.ndarray:
    """The case's int32 ``(num_codebooks, T)`` codes (seeded by the case's position)."""
    n_cb, n_frames, _, _, _, (low, high) = CASES[name]
    rng = np.random.default_rng(list(CASES).index(name))
    codes = rng.integers(low, high, size=(n_cb, n_frames), dtype=np.int64)
    if name == "t7_extremes":
        codes[:, :4] = [-(2**31), -1, 0, 2**31 - 1]
    return codes.astype(np.int32)


# --------------------------------------------------------------------------- s2.cpp's writer and reader


class VoiceToolError(RuntimeError):
    """The voice tool cannot be built or run, or s2.cpp's reader rejected a file."""


def build_tool(s2cpp_dir: str | os.PathLike, build_dir: str | os.PathLike, timeout: float = 600) -> Path:
    """Compile s2voice_tool.cpp with the tree's src/s2_voice.cpp into ``build_dir``; the
    executable. The compiler is $CXX, else c++, g++ or clang++ on PATH."""
    root = Path(s2cpp_dir).expanduser().resolve()
    missing = [f for f in TREE_FILES if not (root / f).is_file()]
    if missing:
        raise VoiceToolError(f"{root}: not an s2.cpp source tree: missing {', '.join(missing)}")
    cxx = os.environ.get("CXX") or next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if cxx is None:
        raise VoiceToolError("no C++ compiler: set CXX or put c++, g++ or clang++ on PATH")
    exe = Path(build_dir) / "s2voice_tool"
    exe.parent.mkdir(parents=True, exist_ok=True)
    cmd = [cxx, "-std=c++17", "-O2", "-I", str(root / "include"), str(TOOL_SOURCE), str(root / "src" / "s2_voice.cpp"),
           "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not exe.is_file():
        raise VoiceToolError(f"compiling the voice tool failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return exe


def _run(exe: Path, *args: str) -> str:
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise VoiceToolError(proc.stderr.strip() or f"s2voice_tool exited {proc.returncode}")
    return proc.stdout


def write_with_s2cpp(exe: Path, path: str | os.PathLike, codes: np.ndarray, sample_rate: int, codebook_size: int,
                     transcript: str) -> Path:
    """``VoiceProfile::save`` of this profile to ``path``."""
    codes = np.asarray(codes, dtype=np.int32)
    n_cb, n_frames = codes.shape
    spec = " ".join([str(n_cb), str(n_frames), str(sample_rate), str(codebook_size),
                     transcript.encode("utf-8").hex() or "-", *map(str, codes.ravel().tolist())])
    with tempfile.TemporaryDirectory(prefix="s2voice_spec_") as tmp:
        spec_path = Path(tmp) / "spec.txt"
        spec_path.write_text(spec + "\n")
        _run(exe, "write", str(spec_path), str(path))
    return Path(path)


def read_with_s2cpp(exe: Path, path: str | os.PathLike) -> dict:
    """What ``VoiceProfile::load`` reads from ``path``: num_codebooks, T_prompt, sample_rate,
    codebook_size, transcript (its bytes decoded as UTF-8), transcript_bytes, and codes as int32
    ``(num_codebooks, T_prompt)`` (ValueError when the engine read a count other than that)."""
    out = json.loads(_run(exe, "read", str(path)))
    raw = bytes.fromhex(out.pop("transcript_hex"))
    codes = np.asarray(out["codes"], dtype=np.int64)
    if codes.size != out["num_codebooks"] * out["T_prompt"]:
        raise ValueError(f"s2.cpp read {codes.size} codes for {out['num_codebooks']} x {out['T_prompt']}")
    out["codes"] = codes.astype(np.int32).reshape(out["num_codebooks"], out["T_prompt"])
    out["transcript_bytes"] = raw
    out["transcript"] = raw.decode("utf-8")
    return out


# --------------------------------------------------------------------------- the golden set


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s2cpp", required=True, help="an s2.cpp source tree (src/s2_voice.cpp is compiled)")
    args = ap.parse_args()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    profiles = {}
    with tempfile.TemporaryDirectory(prefix="s2voice_tool_") as build:
        exe = build_tool(args.s2cpp, build)
        for name, (_, _, rate, cb_size, text, _) in CASES.items():
            codes = case_codes(name)
            path = write_with_s2cpp(exe, GOLDEN / f"{name}.s2voice", codes, rate, cb_size, text)
            back = read_with_s2cpp(exe, path)
            if not (np.array_equal(back["codes"], codes) and back["transcript"] == text
                    and (back["sample_rate"], back["codebook_size"]) == (rate, cb_size)):
                sys.exit(f"{path}: s2.cpp does not read back what it wrote")
            ours = S2VoiceFile.load(path)
            if ours != S2VoiceFile(codes, rate, cb_size, text) or ours.to_bytes() != path.read_bytes():
                sys.exit(f"{path}: this library reads or writes it differently")
            profiles[name] = {"num_codebooks": int(codes.shape[0]), "T": int(codes.shape[1]), "sample_rate": rate,
                              "codebook_size": cb_size, "transcript": text,
                              "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
            print(f"{path.name}: {path.stat().st_size} bytes")
    np.savez_compressed(GOLDEN / "codes.npz", **{name: case_codes(name) for name in CASES})
    source_sha = hashlib.sha256((Path(args.s2cpp) / "src" / "s2_voice.cpp").read_bytes()).hexdigest()
    meta = {"producer": "s2.cpp VoiceProfile::save (src/s2_voice.cpp) via the harness's s2voice_tool.cpp",
            "s2_voice_cpp_sha256": source_sha, "profiles": profiles}
    (GOLDEN / "profiles.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{GOLDEN}: {len(profiles)} profiles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
