"""The corpus job on Ray Data (dataset/ray_encode.py), on one local Ray for the whole module
(``ray.init(num_cpus=2)``: its start-up is seconds) and the tiny model: the manifest, byte-identity
with the CLI's directory mode at 1 and 2 actors, resume after a kill, and refusals before work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pyggml_codec.dataset import MANIFEST, CorpusError, CorpusJob, encode_corpus
from pyggml_codec.io.codefiles import read_codes

try:
    import pyarrow.parquet as pq
    import ray
    RAY_MISSING = None
except ImportError as exc:  # the [ray] extra: skipped without it, failed under PYGGML_REQUIRE=ray
    ray = pq = None
    RAY_MISSING = f"the Ray extra is not installed (pip install 'pyggml_codec[ray]'): {exc}"

REPO = Path(__file__).resolve().parents[2]
# A hang guard, not a speed claim: the resumed job below writes its first files within seconds
# (about 10 s on 2 loaded cores, most of it Ray's start-up); only a job that never writes them
# reaches this.
HANG_S = 1200


@pytest.fixture(scope="module", autouse=True)
def local_ray(require):
    require("ray", RAY_MISSING is None, RAY_MISSING or "")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _write_corpus(root: Path, n_extra: int = 0) -> dict[str, float]:
    """Mixed formats, rates, channel counts and lengths, one corrupt file; name -> seconds."""
    rng = np.random.default_rng(0)
    files = {"a.wav": (44100, 1, 0.7), "sub/b.flac": (48000, 2, 1.3), "sub/deeper/c.ogg": (22050, 1, 0.4),
             "d.wav": (16000, 1, 2.1)}
    files.update({f"many/x{i:02d}.wav": (44100, 1, 0.5) for i in range(n_extra)})
    for name, (rate, channels, seconds) in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        x = 0.1 * rng.standard_normal((int(rate * seconds), channels))
        sf.write(path, x if channels > 1 else x[:, 0], rate)
    (root / "broken.wav").write_bytes(b"RIFF this is no wave file")
    return {name: seconds for name, (_, _, seconds) in files.items()}


def _cli(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyggml_codec", *argv], capture_output=True, text=True,
                          timeout=300, cwd=REPO, **kw)


def _outputs(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.npz")) if not p.name.startswith(".")}


@pytest.mark.parametrize("actors", [1, 2])
def test_manifest_and_byte_identity_with_directory_mode(tiny_model, tmp_path, actors):
    corpus = tmp_path / "corpus"
    lengths = _write_corpus(corpus)
    cli = _cli("encode", str(corpus), "-m", str(tiny_model.f32_path), "-o", str(tmp_path / "cli"), "-q")
    assert cli.returncode == 1 and "broken.wav" in cli.stderr  # the corrupt file fails there too
    report = encode_corpus(CorpusJob(corpus, tmp_path / "ray", tiny_model.f32_path, actors=actors))
    print(report.summary())
    assert _outputs(tmp_path / "ray") == _outputs(tmp_path / "cli")  # byte for byte
    rows = {Path(r["path"]).relative_to(corpus).as_posix(): r for r in pq.read_table(tmp_path / "ray" / MANIFEST).to_pylist()}
    assert set(rows) == set(lengths) | {"broken.wav"}
    assert rows["broken.wav"]["status"] == "failed" and "cannot decode audio" in rows["broken.wav"]["error"]
    for name, seconds in lengths.items():
        r = rows[name]
        assert r["status"] == "encoded" and r["error"] == "", r
        assert r["duration_s"] == pytest.approx(seconds, abs=1e-3)
        assert r["frames"] == read_codes(r["output"]).n_frames == -(-round(seconds * 44100) // 2048)
        assert r["pad_to"] == "code_frame" and len(r["model_sha256"]) == 64
    again = encode_corpus(CorpusJob(corpus, tmp_path / "ray", tiny_model.f32_path, actors=actors))
    assert again.count("skipped") == len(lengths) and again.count("encoded") == 0  # idempotent


def _job_processes(leader: int) -> list[int]:
    """The processes of a job started in a session of its own: its session's, and every
    descendant of its leader (Ray may start its daemons in sessions of their own)."""
    parent, session = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parent[int(entry)], session[int(entry)] = int(fields[1]), int(fields[3])
    found = {pid for pid, sid in session.items() if sid == leader}
    todo = [leader]
    while todo:
        p = todo.pop()
        for child in (c for c, pp in parent.items() if pp == p and c not in found):
            found.add(child)
            todo.append(child)
    return sorted(found - {leader, os.getpid()})


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # dead, not yet reaped
    except OSError:
        return True


def _kill_job(proc: subprocess.Popen) -> int:
    """SIGKILL the job and wait until none of its processes runs: a Ray worker left running
    could still write a file (or its temporary) while the resumed job runs."""
    others = _job_processes(proc.pid) if os.path.isdir("/proc") else []
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in others:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass  # already gone
    proc.wait()
    start = time.monotonic()
    while not all(_gone(pid) for pid in others):
        if time.monotonic() - start > HANG_S:
            pytest.fail(f"processes of the killed job still run after {HANG_S} s: "
                        f"{[pid for pid in others if not _gone(pid)]}")
        time.sleep(0.05)
    return len(others) + 1


def test_resume_after_a_kill_encodes_only_the_rest(tiny_model, tmp_path):
    corpus, out = tmp_path / "corpus", tmp_path / "codes"
    lengths = _write_corpus(corpus, n_extra=40)
    proc = subprocess.Popen([sys.executable, "-m", "pyggml_codec", "encode", str(corpus), "-m", str(tiny_model.f32_path),
                             "-o", str(out), "--ray", "-q"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    # The event that stops the job: its third output file (not a time). The hang guard only ends
    # a job that never gets there.
    start = time.monotonic()
    while len(_outputs(out) if out.exists() else {}) < 3 and proc.poll() is None:
        if time.monotonic() - start > HANG_S:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the Ray job hung: fewer than 3 outputs after {HANG_S} s and still running")
        time.sleep(0.02)
    exited = proc.poll()
    killed = _kill_job(proc)  # the driver and the local Ray it started, every process of it gone
    done = _outputs(out)
    print(f"killed {killed} processes after {len(done)} of {len(lengths)} files "
          f"({time.monotonic() - start:.1f} s after the start)")
    assert exited is None, f"the job exited (status {exited}) before its third output; it was never stopped partway"
    assert 3 <= len(done) < len(lengths), "the job was not stopped partway"
    for name in done:
        read_codes(out / name)  # every visible output is whole
    report = encode_corpus(CorpusJob(corpus, out, tiny_model.f32_path, actors=2))
    print(report.summary())
    # A Ray worker that was mid-file at the kill may still land that file (atomically) before it
    # sees its raylet gone: seen once under a loaded machine (4 skipped after 3 seen). Such a file
    # is whole and is skipped too; every other file is encoded once.
    skipped = report.count("skipped")
    assert len(done) <= skipped < len(lengths)
    assert report.count("encoded") == len(lengths) - skipped
    assert report.count("failed") == 1
    assert not list(out.rglob(".*.tmp"))  # a killed write's temporary is gone
    cli = tmp_path / "cli"
    _cli("encode", str(corpus), "-m", str(tiny_model.f32_path), "-o", str(cli), "-q")
    assert _outputs(out) == _outputs(cli)


def test_refusals_before_any_work(tiny_model, tmp_path):
    corpus = tmp_path / "corpus"
    _write_corpus(corpus)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + bytes(100))
    cases = [
        (CorpusJob(tmp_path / "missing", tmp_path / "o", tiny_model.f32_path), "no such corpus directory"),
        (CorpusJob(corpus, corpus / "codes", tiny_model.f32_path), "must not be inside the corpus"),
        (CorpusJob(corpus, tmp_path / "o", garbage), "the codec refuses the model"),
        (CorpusJob(corpus, tmp_path / "o", tiny_model.f32_path, fmt="wav"), "unknown code file format"),
        (CorpusJob(corpus, tmp_path / "o", tiny_model.f32_path, backend="no-such-gpu"), "is not in this ggml build"),
    ]
    for job, message in cases:
        with pytest.raises(CorpusError, match=message):
            encode_corpus(job)
        assert not (tmp_path / "o").exists() and not (corpus / "codes").exists()
    with pytest.raises(CorpusError, match="cannot reach the Ray cluster at 127.0.0.1:1"):
        encode_corpus(CorpusJob(corpus, tmp_path / "o", tiny_model.f32_path), address="127.0.0.1:1")
    r = _cli("encode", str(corpus), "-m", str(tiny_model.f32_path), "-o", str(tmp_path / "o"), "--ray", "127.0.0.1:1")
    assert r.returncode == 1 and "cannot reach the Ray cluster" in r.stderr
    r = _cli("encode", str(corpus / "a.wav"), "-m", str(tiny_model.f32_path), "-o", str(tmp_path / "a.npz"), "--ray")
    assert r.returncode == 2 and "--ray encodes a directory" in r.stderr


def test_a_failure_on_the_ray_side_is_a_clear_error_and_keeps_the_manifest(tiny_model, tmp_path):
    """Actors that cannot load their codec (here an impossible precision, which only the actors
    see) stop the job: a CorpusError naming what was done, and the manifest of that."""
    corpus, out = tmp_path / "corpus", tmp_path / "codes"
    _write_corpus(corpus)
    (out / "a.npz").parent.mkdir(parents=True)
    encode_corpus(CorpusJob(corpus, tmp_path / "first", tiny_model.f32_path))
    (out / "a.npz").write_bytes((tmp_path / "first" / "a.npz").read_bytes())  # one file done before
    with pytest.raises(CorpusError, match=r"the Ray job stopped after 1 of 5 files.*precision must be 'f32' or "):
        encode_corpus(CorpusJob(corpus, out, tiny_model.f32_path, precision="f64"))
    rows = pq.read_table(out / MANIFEST).to_pylist()
    assert [r["status"] for r in rows] == ["skipped"]  # a.wav, done before; nothing else was done
