"""Progress bars: tqdm bars on stderr for a file's encode and decode, a directory run, quantize and
convert with ``--progress``; nothing with ``--no-progress``, ``-q``, or when stderr is not a
terminal (and no flag); bars by default on a terminal. The library reports, the CLI renders."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pyggml_codec.cli import main as cli_main
from pyggml_codec.cli.progress import Bars, progress_enabled
from pyggml_codec.progress import Progress

REPO = Path(__file__).resolve().parents[2]
BAR = re.compile(r"(\w[\w ]*): +100%\|")  # a finished tqdm bar: "encode: 100%|#####| 3/3 [...]"


def run(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pyggml_codec", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def bars_in(stderr: str) -> set[str]:
    return set(BAR.findall(stderr))


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model):
    d = tmp_path_factory.mktemp("progress")
    x = 0.3 * np.sin(2 * np.pi * 440 * np.arange(30000) / 44100)
    (d / "corpus" / "sub").mkdir(parents=True)
    sf.write(d / "tone.wav", x, 44100, subtype="FLOAT")
    sf.write(d / "corpus" / "a.wav", x, 44100, subtype="FLOAT")
    sf.write(d / "corpus" / "sub" / "b.flac", np.stack([x, x], axis=1), 44100)
    return d


def test_progress_shows_tqdm_bars_for_each_long_job(tiny_model, files, tmp_path):
    from pyggml_codec.model.convert import write_merged_fixture

    m = tiny_model.f32_path
    enc = run("encode", files / "tone.wav", "-m", m, "-o", tmp_path / "a.npz", "--progress")
    assert enc.returncode == 0 and "encode" in bars_in(enc.stderr) and "tone.wav" in enc.stderr, enc.stderr
    dec = run("decode", tmp_path / "a.npz", "-m", m, "-o", tmp_path / "a.wav", "--progress")
    assert dec.returncode == 0 and "decode" in bars_in(dec.stderr), dec.stderr
    rt = run("roundtrip", files / "tone.wav", "-m", m, "-o", tmp_path / "rt.wav", "--progress")
    assert rt.returncode == 0 and {"encode", "decode"} <= bars_in(rt.stderr), rt.stderr
    batch = run("encode", files / "corpus", "-m", m, "-o", tmp_path / "codes", "--progress")
    assert batch.returncode == 0 and "corpus" in bars_in(batch.stderr) and "2/2" in batch.stderr, batch.stderr
    assert "corpus audio" in batch.stderr and "h" in batch.stderr
    quant = run("quantize", m, tmp_path / "q.gguf", "--progress")
    assert quant.returncode == 0 and "quantize" in bars_in(quant.stderr) and "tensors" in quant.stderr, quant.stderr
    merged = write_merged_fixture(tiny_model.f16_path, tmp_path / "merged.gguf")
    conv = run("convert", merged, tmp_path / "codec.gguf", "--extract", "--progress")
    assert conv.returncode == 0 and "convert" in bars_in(conv.stderr), conv.stderr
    assert "B/s" in conv.stderr or "B [" in conv.stderr  # bytes, scaled


@pytest.mark.parametrize("flags", [["--no-progress"], [], ["--progress", "-q"]])
def test_no_bars_without_progress_or_off_a_terminal(tiny_model, files, tmp_path, flags):
    """The subprocess's stderr is a pipe: no flag means no bars, like --no-progress; -q wins."""
    m = tiny_model.f32_path
    outputs = [
        run("encode", files / "tone.wav", "-m", m, "-o", tmp_path / "a.npz", *flags),
        run("decode", tmp_path / "a.npz", "-m", m, "-o", tmp_path / "a.wav", *flags),
        run("encode", files / "corpus", "-m", m, "-o", tmp_path / "codes", *flags),
        run("quantize", m, tmp_path / "q.gguf", *flags),
    ]
    for proc in outputs:
        assert proc.returncode == 0, proc.stderr
        assert "%|" not in proc.stderr and "\r" not in proc.stderr, proc.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_by_default_on_a_terminal(tiny_model, files, tmp_path, monkeypatch):
    fake = _Terminal()
    monkeypatch.setattr(sys, "stderr", fake)
    assert cli_main.main(["encode", str(files / "tone.wav"), "-m", str(tiny_model.f32_path),
                          "-o", str(tmp_path / "a.npz")]) == 0
    assert "encode" in bars_in(fake.getvalue()), fake.getvalue()
    fake.truncate(0)
    assert cli_main.main(["decode", str(tmp_path / "a.npz"), "-m", str(tiny_model.f32_path),
                          "-o", str(tmp_path / "a.wav"), "--no-progress"]) == 0
    assert "%|" not in fake.getvalue()


def test_progress_enabled_rules():
    tty, pipe = _Terminal(), io.StringIO()
    ns = types.SimpleNamespace
    assert progress_enabled(ns(quiet=False, progress=None), tty)
    assert not progress_enabled(ns(quiet=False, progress=None), pipe)
    assert progress_enabled(ns(quiet=False, progress=True), pipe)
    assert not progress_enabled(ns(quiet=False, progress=False), tty)
    assert not progress_enabled(ns(quiet=True, progress=True), tty)


def test_bars_render_reports_and_start_over_on_a_new_unit():
    out = io.StringIO()
    with Bars(True, out) as bars:
        for i in range(4):
            bars(Progress("quantize", i + 1, 4, "tensors", f"t{i}"))
        bars(Progress("quantize", 0, 2048, "bytes"))
        bars(Progress("quantize", 1024, 2048, "bytes", "t3"))
        bars(Progress("corpus audio", 0.0123, None, "h"))
    text = out.getvalue()
    assert "quantize: 100%|" in text and "4/4" in text and "t3" in text
    assert "1.00k/2.00k" in text and "B/s" in text  # bytes, scaled; a new bar for the new unit
    assert "corpus audio: 0.012h" in text  # no total: a counter
    silent = io.StringIO()
    Bars(False, silent)(Progress("encode", 1, 2, "frames"))
    assert silent.getvalue() == ""


def test_ray_corpus_reports_files_and_audio_hours(tiny_model, files, tmp_path):
    """The Ray job's progress (``dataset.ray_encode._run``) with Ray Data stood in for by a
    single-process runner: one "corpus" report per file, and the hours encoded so far."""
    from pyggml_codec.dataset import ray_encode

    class Dataset:
        def __init__(self, items):
            self.items = items

        def map_batches(self, cls, fn_constructor_kwargs, **_):
            worker = cls(**fn_constructor_kwargs)
            rows = []
            for item in self.items:
                out = worker({"src": np.array([item["src"]]), "dst": np.array([item["dst"]])})
                rows.append({k: v[0] for k, v in out.items()})
            return Dataset(rows)

        def iter_rows(self):
            return iter(self.items)

    context = types.SimpleNamespace(enable_progress_bars=True)
    data = types.SimpleNamespace(DataContext=types.SimpleNamespace(get_current=lambda: context),
                                 from_items=lambda items, override_num_blocks: Dataset(items),
                                 ActorPoolStrategy=lambda size: None)
    fake_ray = types.SimpleNamespace(data=data)
    job = ray_encode.CorpusJob(files / "corpus", tmp_path / "out", tiny_model.f32_path)
    work = [(files / "corpus" / "a.wav", tmp_path / "out" / "a.npz"),
            (files / "corpus" / "sub" / "b.flac", tmp_path / "out" / "sub" / "b.npz")]
    seen, rows = [], []
    ray_encode._run(fake_ray, job, "0" * 64, work, seen.append, rows)
    assert [r["status"] for r in rows] == ["encoded", "encoded"]
    files_reports = [p for p in seen if p.task == "corpus"]
    hours = [p for p in seen if p.task == "corpus audio"]
    assert [(p.done, p.total, p.unit) for p in files_reports] == [(1, 2, "files"), (2, 2, "files")]
    assert "a.wav" in files_reports[0].detail and files_reports[0].detail.startswith("encoded")
    assert hours[-1].unit == "h" and hours[-1].total is None
    assert hours[-1].done == pytest.approx(2 * 30000 / 44100 / 3600)
    assert Path(tmp_path / "out" / "sub" / "b.npz").is_file()
