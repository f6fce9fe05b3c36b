"""A speech corpus to code files on Ray Data: one laptop (a local Ray) or a cluster (an address).

    from pyggml_codec.dataset import CorpusJob, encode_corpus
    report = encode_corpus(CorpusJob("corpus/", "codes/", "s2-codec.gguf", actors=2))

The corpus tree is mirrored into the output tree, one code file per audio file, exactly as the
CLI's directory mode does (``tools/corpus.py``: the same reader, resampler, encoder and writer,
so the files are byte-identical whatever the actor count). Each actor of a Ray Data actor pool
(``map_batches``) holds one loaded codec, with ``threads_per_actor`` CPU threads (or one GPU per
actor, ``backend="cuda"`` etc., where the build has one).

Resumable and idempotent: an output that exists is not encoded again (unless ``force``); every
file is written atomically, so a worker or driver killed mid-file leaves only a hidden temporary
file, which the next run removes. A file that cannot be read or encoded is recorded in the
manifest with its error; it never stops the job. The manifest (``manifest.parquet`` in the output
root) has one row per audio file: path, output, duration_s, frames, model_sha256, pad_to, status
("encoded", "skipped": encoded by an earlier run, "failed") and error.

Needs the optional extra: ``pip install pyggml_codec[ray]``. On a cluster every node needs
pyggml_codec installed and the corpus, model and output paths visible at the same paths.
"""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..api import load
from ..backend.runtime import available_backends
from ..errors import CodecError
from ..io.codefiles import EXTENSIONS as CODE_EXTENSIONS
from ..io.codefiles import read_codes
from ..io.fileio import atomic_path
from ..progress import ProgressCallback, report
from .corpus import AUDIO_EXTENSIONS, encode_file, file_sha256, plan_batch, read_input_audio

MANIFEST = "manifest.parquet"
COLUMNS = ("path", "output", "duration_s", "frames", "model_sha256", "pad_to", "status", "error")


class CorpusError(CodecError, ValueError):
    """A corpus job that cannot start: a bad path, a model the codec refuses, no Ray."""


@dataclass(frozen=True)
class CorpusJob:
    """What to encode and how; paths as the workers see them."""

    corpus: str | os.PathLike
    output: str | os.PathLike
    model: str | os.PathLike
    fmt: str = "npz"  # code file format: npz, npy or s2voice
    pad_to: str = "code_frame"
    resample: str = "soxr"
    precision: str = "f32"
    backend: str = "cpu"
    actors: int = 1
    threads_per_actor: int = 1
    gpus_per_actor: float = 0.0
    force: bool = False


@dataclass
class CorpusReport:
    """The run's summary; ``rows`` is the manifest."""

    rows: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    stale_removed: int = 0
    manifest: Path | None = None

    def count(self, status: str) -> int:
        return sum(r["status"] == status for r in self.rows)

    def summary(self) -> str:
        hours = sum(r["duration_s"] or 0.0 for r in self.rows if r["status"] == "encoded") / 3600
        rate = hours / (self.wall_s / 3600) if self.wall_s > 0 else float("inf")
        return (f"{self.count('encoded')} encoded ({hours * 3600:.1f} s of audio, {rate:.1f} audio hours per wall "
                f"hour), {self.count('skipped')} skipped (done before), {self.count('failed')} failed; "
                f"{self.wall_s:.1f} s; manifest {self.manifest}")


class _Encoder:
    """One actor: a loaded codec, encoding a batch of (src, dst) rows."""

    def __init__(self, model: str, job: dict, sha: str):
        self.job, self.sha = job, sha
        self.codec = load(model, backend=job["backend"], n_threads=job["threads_per_actor"],
                          precision=job["precision"], parts="encode", strict_backend=True)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        out: dict[str, list] = {c: [] for c in COLUMNS}
        for src, dst in zip(batch["src"], batch["dst"]):
            row = {"path": str(src), "output": str(dst), "duration_s": None, "frames": None,
                   "model_sha256": self.sha, "pad_to": self.job["pad_to"], "status": "encoded", "error": ""}
            try:
                summary = encode_file(self.codec, read_input_audio(Path(src)), Path(dst), sha=self.sha,
                                      pad_to=self.job["pad_to"], resample_method=self.job["resample"])
                row["duration_s"], row["frames"] = summary.audio_seconds, summary.frames
            except (CodecError, OSError, ValueError) as exc:
                row["status"], row["error"] = "failed", str(exc) or type(exc).__name__
            for c in COLUMNS:
                out[c].append(row[c])
        return out


def check_job(job: CorpusJob) -> None:
    """Every check that needs neither Ray nor the model; CorpusError naming the problem."""
    corpus, output = Path(job.corpus), Path(job.output)
    if not corpus.exists():
        raise CorpusError(f"{corpus}: no such corpus directory")
    if not corpus.is_dir():
        raise CorpusError(f"{corpus}: the corpus must be a directory")
    if output.exists() and not output.is_dir():
        raise CorpusError(f"{output}: the output must be a directory")
    if output.resolve() == corpus.resolve() or corpus.resolve() in output.resolve().parents:
        raise CorpusError(f"{output}: the output directory must not be inside the corpus {corpus}")
    if "." + job.fmt not in CODE_EXTENSIONS:
        raise CorpusError(f"unknown code file format {job.fmt!r}; choices: {', '.join(e[1:] for e in CODE_EXTENSIONS)}")
    if job.actors < 1 or job.threads_per_actor < 1:
        raise CorpusError(f"actors and threads per actor must be >= 1, got {job.actors} and {job.threads_per_actor}")
    if job.gpus_per_actor < 0:
        raise CorpusError(f"GPUs per actor must be >= 0, got {job.gpus_per_actor}")
    if job.gpus_per_actor > 0 and job.backend in ("cpu", "auto"):
        raise CorpusError("GPUs per actor need a GPU backend (cuda, vulkan, metal), not " + repr(job.backend))
    if not Path(job.model).is_file():
        raise CorpusError(f"{job.model}: no such model file")


def _check_model(job: CorpusJob) -> None:
    if job.backend != "cpu" and job.backend not in available_backends():
        raise CorpusError(f"backend {job.backend!r} is not in this ggml build (it has {', '.join(available_backends())})")

    try:
        load(job.model, backend="cpu", n_threads=1, parts="encode").close()
    except CodecError as exc:
        raise CorpusError(f"the codec refuses the model: {exc}") from exc


def _import_ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise CorpusError(f"the Ray path needs Ray Data: pip install 'pyggml_codec[ray]' ({exc})") from None
    return ray


def _probe(address: str, timeout: float = 5.0) -> None:
    """A TCP connect to ``host:port`` first: Ray itself waits minutes on an address nobody serves."""
    import socket

    hostport = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise CorpusError(f"cannot reach the Ray cluster at {address}: {exc}") from None


def _connect(ray, job: CorpusJob, address: str | None) -> bool:
    """Join ``address`` or start a local Ray; True when this call started the connection."""
    if ray.is_initialized():
        return False
    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    try:
        if address:
            _probe(address)
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=max(os.cpu_count() or 1, job.actors * job.threads_per_actor), **kwargs)
    except CorpusError:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError ...
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise CorpusError(f"cannot start or reach {where}: {type(exc).__name__}: {exc}") from None
    return True


def _remove_stale_temporaries(work: list[tuple[Path, Path]]) -> int:
    """Hidden temporary files of a killed earlier run (atomic writes: ``.NAME.*.tmp``)."""
    removed = 0
    for _, dst in work:
        if dst.parent.is_dir():
            for tmp in dst.parent.glob(f".{glob.escape(dst.name)}.*.tmp"):
                tmp.unlink(missing_ok=True)
                removed += 1
    return removed


def _skipped_row(corpus: Path, output: Path, dst: Path, sha: str, pad_to: str, previous: dict) -> dict:
    row = previous.get(str(dst))
    if row is not None and row["status"] != "failed":
        return {**row, "status": "skipped"}
    try:
        cf = read_codes(dst)
        duration = cf.n_samples / cf.sample_rate if cf.n_samples and cf.sample_rate else None
        return {"path": str(corpus / dst.relative_to(output)), "output": str(dst), "duration_s": duration,
                "frames": cf.n_frames, "model_sha256": cf.meta.get("model_sha256", sha),
                "pad_to": cf.meta.get("pad_to", pad_to), "status": "skipped", "error": ""}
    except (CodecError, OSError, ValueError) as exc:
        return {"path": "", "output": str(dst), "duration_s": None, "frames": None, "model_sha256": sha,
                "pad_to": pad_to, "status": "skipped", "error": f"existing output unreadable: {exc}"}


def _read_manifest(path: Path) -> dict:
    if not path.is_file():
        return {}
    import pyarrow.parquet as pq

    try:
        return {r["output"]: r for r in pq.read_table(path).to_pylist()}
    except Exception:  # noqa: BLE001 - a damaged manifest is rebuilt from the code files
        return {}


def _write_manifest(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("path", pa.string()), ("output", pa.string()), ("duration_s", pa.float64()),
                        ("frames", pa.int64()), ("model_sha256", pa.string()), ("pad_to", pa.string()),
                        ("status", pa.string()), ("error", pa.string())])
    table = pa.Table.from_pylist(sorted(rows, key=lambda r: r["output"]), schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def encode_corpus(job: CorpusJob, address: str | None = None,
                  progress: ProgressCallback | None = None) -> CorpusReport:
    """Encode every audio file of ``job.corpus`` that has no code file yet; write the manifest.

    ``address``: a Ray cluster to join ("auto", "ray://host:10001", ...); None starts a local
    Ray (or uses the one this process already has). Raises CorpusError before any work for a
    bad corpus or output path, a model the codec refuses, or a Ray that cannot be reached.
    ``progress`` gets, per finished file, a "corpus" report in files (detail: status and path)
    and a "corpus audio" report in hours of audio encoded (no total)."""
    check_job(job)
    _check_model(job)
    ray = _import_ray()
    if address:
        _probe(address)  # before any work, even when every file is done
    corpus, output = Path(job.corpus), Path(job.output)
    start = time.perf_counter()
    sha = file_sha256(Path(job.model))
    work, skipped, failed = plan_batch(corpus, output, AUDIO_EXTENSIONS, "." + job.fmt, job.force)
    report = CorpusReport(manifest=output / MANIFEST, stale_removed=_remove_stale_temporaries(work))
    previous = _read_manifest(report.manifest)
    report.rows += [_skipped_row(corpus, output, dst, sha, job.pad_to, previous) for dst in skipped]
    report.rows += [{"path": str(src), "output": "", "duration_s": None, "frames": None, "model_sha256": sha,
                     "pad_to": job.pad_to, "status": "failed", "error": why} for src, why in failed]
    started = _connect(ray, job, address) if work else False
    try:
        if work:
            _run(ray, job, sha, work, progress, report.rows)
    except Exception as exc:  # noqa: BLE001 - a Ray-side failure (an actor that cannot load, a lost node)
        raise CorpusError(f"the Ray job stopped after {len(report.rows)} of {len(work) + len(skipped) + len(failed)} "
                          f"files, recorded in {report.manifest}: {type(exc).__name__}: {_root_cause(exc)}") from exc
    finally:
        if started:
            ray.shutdown()
        report.wall_s = time.perf_counter() - start
        _write_manifest(report.manifest, report.rows)  # also what a failed run did, for the next one
    return report


def _root_cause(exc: Exception) -> str:
    """The last line of a Ray error (it carries the remote traceback; the last line is the cause)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _run(ray, job: CorpusJob, sha: str, work: list[tuple[Path, Path]], progress, rows: list[dict]) -> None:
    import logging

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # its per-stage INFO lines; progress is ours
    ray.data.DataContext.get_current().enable_progress_bars = False
    items = [{"src": str(src), "dst": str(dst)} for src, dst in work]
    fields = {k: getattr(job, k) for k in ("backend", "threads_per_actor", "precision", "pad_to", "resample")}
    # one block per file, so that every actor gets work (Ray would otherwise coalesce small rows)
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(_Encoder, fn_constructor_kwargs={"model": str(job.model), "job": fields, "sha": sha},
                        batch_size=1, compute=ray.data.ActorPoolStrategy(size=job.actors),
                        num_cpus=job.threads_per_actor, num_gpus=job.gpus_per_actor or None)
    done, seconds = 0, 0.0
    for row in ds.iter_rows():
        done += 1
        rows.append({c: (row[c].item() if hasattr(row[c], "item") else row[c]) for c in COLUMNS})
        seconds += rows[-1]["duration_s"] or 0.0
        report(progress, "corpus", done, len(items), "files", f"{rows[-1]['status']} {rows[-1]['path']}")
        report(progress, "corpus audio", seconds / 3600, None, "h")
