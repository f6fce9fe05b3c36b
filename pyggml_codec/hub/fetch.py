"""Fetch the codec of a published merged S2 Pro GGUF, downloading only the codec's bytes.

The C++ engine's merged files (``fish-speech``: the language model and, under ``c.``, the
codec) are published on the Hugging Face Hub, by default in ``rodrigomt/s2-pro-gguf``
(``s2-pro-f16.gguf`` 9.9 GB down to ``s2-pro-q2_k.gguf`` 2.6 GB); the codec is about 0.8 GB
of each. :func:`fetch`:

1. reads the file's header over HTTP range requests, growing the range until the tensor
   table parses, and checks it is an S2 codec (metadata and every tensor's name, shape and
   type, before any weight is downloaded);
2. downloads the byte ranges of the codec tensors only, into ``OUT.part`` (a compact
   ``fish-speech`` GGUF holding just those tensors), recording what is done in
   ``OUT.part.json``; an interrupted fetch resumes there when the remote file's size, ETag
   and header are unchanged (else it starts over); transient failures are retried;
3. writes ``OUT`` atomically with the converter's own extraction (``convert --extract``):
   the same bytes as extracting from the whole download;
4. verifies the result: every tensor's byte count, a re-parse of the written file, and a
   load on the CPU.

The default output lies in the cache folder: ``$PYGGML_CODEC_CACHE``, else
``$HF_HOME/pyggml_codec`` (``~/.cache/huggingface/pyggml_codec``), as
``models--OWNER--NAME/REVISION/STEM-codec.gguf`` (``urls/HASH/STEM-codec.gguf`` for a URL):
beside the Hub's own cache (``$HF_HOME/hub``), not inside it, whose layout belongs to
``huggingface_hub`` (a foreign folder there is reported as corrupt by ``huggingface-cli scan-cache``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
import urllib.parse
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..api import load
from ..errors import CodecError, FetchError, ModelFileError
from ..io.fileio import atomic_path, write_bytes_atomic
from ..model import layout as model_layout
from ..model.config import CodecConfig
from ..model.convert import BUFFER_SUFFIXES, CODEC_ARCH, MERGED_ARCH, MERGED_PREFIX, extract_codec
from ..model.gguf_file import ModelFile
from ..model.gguf_header import HeaderIncomplete, HeaderLayout, RemoteTensor, compact_header, parse_header
from ..model.weights import check_tensors, expected_tensors, ffn_width_reader
from ..progress import ProgressCallback, report
from .endpoint import RangeReader, hf_home, hub_endpoint, hub_offline, hub_token, hub_url, read_exactly

DEFAULT_REPO = "rodrigomt/s2-pro-gguf"
DEFAULT_FILE = "s2-pro-f16.gguf"
HEADER_FIRST_BYTES = 2 << 20  # then doubled until the tensor table parses (S2 Pro's is ~6 MB)
MERGE_GAP = 64 << 10  # ranges this close are read in one request
CHUNK = 1 << 20
SAVE_EVERY = 32 << 20  # bytes between two saves of the resume state
RETRY_BACKOFF_S = 1.0  # doubled after each failed try
STATE_VERSION = 1
_KEPT_KEYS = ("general.architecture", "general.alignment")


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """Where fetched codecs go: ``path``, else ``$PYGGML_CODEC_CACHE``, else ``$HF_HOME/pyggml_codec``."""
    if path is not None:
        return Path(path).expanduser()
    if os.environ.get("PYGGML_CODEC_CACHE"):
        return Path(os.environ["PYGGML_CODEC_CACHE"]).expanduser()
    return hf_home() / "pyggml_codec"


def _codec_name(filename: str) -> str:
    stem = Path(urllib.parse.unquote(filename)).name or "model.gguf"
    return f"{stem.removesuffix('.gguf')}-codec.gguf"


def default_output(url: str | None = None, repo: str = DEFAULT_REPO, filename: str = DEFAULT_FILE,
                   revision: str = "main", cache: str | os.PathLike | None = None) -> Path:
    """The path :func:`fetch` writes when no output is given."""
    if url is not None:
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        return cache_dir(cache) / "urls" / digest / _codec_name(urllib.parse.urlsplit(url).path)
    folder = "models--" + repo.replace("/", "--")
    return cache_dir(cache) / folder / revision.replace("/", "--") / _codec_name(filename)


def fetch(url: str | None = None, *, repo: str | None = None, filename: str | None = None,
          revision: str = "main", output: str | os.PathLike | None = None,
          cache: str | os.PathLike | None = None, token: str | bool | None = None, endpoint: str | None = None,
          force: bool = False, verify: bool = True, retries: int = 3, timeout: float = 60.0,
          progress: ProgressCallback | None = None) -> Path:
    """Download the codec of a merged S2 Pro GGUF as a codec-only file; returns its path.

    The source is ``url`` (http or https), or the Hub file ``repo`` / ``filename`` at
    ``revision`` (default ``rodrigomt/s2-pro-gguf`` / ``s2-pro-f16.gguf`` / ``main``) under
    ``endpoint`` (default ``HF_ENDPOINT`` or the Hub). ``token``: a Hub token, False for none,
    default ``HF_TOKEN`` or the saved login (sent to the endpoint's host only). ``output``
    defaults to :func:`default_output` under ``cache``; an existing output is returned as is
    unless ``force``. ``verify=False`` skips the final CPU load. ``progress`` receives
    ``Progress("fetch", done_bytes, total_bytes, "bytes")`` reports.

    ``retries``: how many times a failed request is retried, each resuming where it stopped;
    ``timeout``: seconds without data before a request fails.

    Returns the :class:`~pathlib.Path` of the written codec-only ``fish-speech-codec`` GGUF,
    which :func:`pyggml_codec.load` reads. Raises FetchError (HTTP status, no range support,
    truncated body, full disk, offline with ``HF_HUB_OFFLINE`` and nothing cached), ModelFileError and
    its subclasses (not an S2 merged GGUF), ValueError (bad arguments).
    """
    if url is not None and (repo or filename):
        raise ValueError("give either a URL or repo/filename, not both")
    if retries < 0 or not timeout > 0:
        raise ValueError(f"retries must be >= 0 and timeout > 0, got {retries} and {timeout}")
    if url is None:
        repo, filename = repo or DEFAULT_REPO, filename or DEFAULT_FILE
        url, send = hub_url(repo, filename, revision, endpoint), hub_token(token)
        label = filename
    else:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"expected an http(s) URL, got {url!r}")
        same_host = parts.netloc == urllib.parse.urlsplit(hub_endpoint(endpoint)).netloc
        send = token if isinstance(token, str) else hub_token(token) if same_host else None
        label = Path(parts.path).name
    if output is not None:
        out = Path(output).expanduser()
        if not out.parent.is_dir():
            raise FetchError(f"{out.parent}: no such directory for the output")
    else:
        out = default_output(url if repo is None else None, repo or DEFAULT_REPO, filename or DEFAULT_FILE,
                             revision, cache)
    if out.exists() and not force:
        if not out.is_file():
            raise FetchError(f"{out} exists and is not a file")
        return out
    if hub_offline():
        raise FetchError(f"HF_HUB_OFFLINE is set and {out} has not been fetched yet")
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(out):
        return _Fetch(RangeReader(url, send, timeout), out, label, retries, progress).run(verify)


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold ``OUT.part.lock`` while fetching ``out``, so that a second fetch of the same output
    fails at once instead of writing the same .part file. An advisory lock (``flock``), which
    the system releases when the process dies; none where ``fcntl`` is missing (Windows)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    lock = out.with_name(out.name + ".part.lock")
    with open(lock, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(lock).st_ino != os.fstat(f.fileno()).st_ino:  # removed by a fetch that just ended
                raise OSError
        except OSError:
            raise FetchError(f"{out}: another fetch is writing it now") from None
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)


class _Fetch:
    def __init__(self, reader: RangeReader, out: Path, label: str, retries: int, progress):
        self.reader, self.out, self.label, self.retries, self.progress = reader, out, label, retries, progress
        self.part = out.with_name(out.name + ".part")
        self.state_path = out.with_name(out.name + ".part.json")
        self.done: list[list[int]] = []  # fetched [start, end) of the remote file, merged
        self.received = 0  # bytes received in this run, so that retries reset after progress

    def run(self, verify: bool) -> Path:
        prefix, layout = self._read_header()
        keep = codec_tensors(layout)
        keys = [k for k in layout.kv_spans if k in _KEPT_KEYS or k.startswith(model_layout.PREFIX)]
        head, offsets, part_size = compact_header(layout, prefix, keys, keep)
        self.tensors, self.offsets = keep, offsets
        self.starts = [t.start for t in keep]
        spans = merge_ranges([(t.start, t.end) for t in keep], MERGE_GAP)
        state = {"version": STATE_VERSION, "url": self.reader.url, "size": layout.size,
                 "etag": self.reader.identity.etag, "header_sha256": layout.digest, "part_size": part_size}
        self._resume(state)
        total = sum(e - s for s, e in spans)
        self._check_space(total - _covered(self.done, spans) + part_size)
        try:
            with open(self.part, "r+b" if self.part.exists() else "w+b") as f:
                f.truncate(part_size)
                f.seek(0)
                f.write(head)
                self._download(f, spans, state, total)
        except OSError as exc:
            raise _disk_error(exc, self.part) from exc
        for t in keep:
            got = _covered(self.done, [(t.start, t.end)])
            if got != t.nbytes:
                raise FetchError(f"{self.out}: tensor {t.name} has {got} of its {t.nbytes} bytes")
        self._write(verify, keep)
        self.part.unlink(missing_ok=True)
        self.state_path.unlink(missing_ok=True)
        return self.out

    # ----------------------------------------------------------------- header

    def _read_header(self) -> tuple[bytes, HeaderLayout]:
        have = bytearray()
        want = HEADER_FIRST_BYTES
        while True:
            end = len(have) + want
            self._retrying(lambda: self._read_into(have, end, have.extend))
            try:
                return bytes(have), parse_header(have, self.reader.identity.size, self.reader.url)
            except HeaderIncomplete as exc:
                want = max(exc.needed - len(have), len(have))

    def _read_into(self, have: bytearray, end: int, sink) -> None:
        response, size = self.reader.open(len(have), end)

        def counted(piece: bytes) -> None:
            sink(piece)
            self.received += len(piece)

        read_exactly(response, min(end, size) - len(have), counted, CHUNK, self.reader.url)

    def _retrying(self, step) -> None:
        failures = 0
        while True:
            mark = self.received
            try:
                return step()
            except FetchError as exc:
                if not getattr(exc, "transient", False):
                    raise
                failures = 1 if self.received > mark else failures + 1
                if failures > self.retries:
                    raise FetchError(f"{exc} (after {self.retries} retries; run the fetch again to resume)") from None
                time.sleep(RETRY_BACKOFF_S * 2 ** (failures - 1))

    # ----------------------------------------------------------------- resume state

    def _resume(self, state: dict) -> None:
        try:
            old = json.loads(self.state_path.read_text())
            same = all(old.get(k) == v for k, v in state.items())
            sized = self.part.is_file() and self.part.stat().st_size == state["part_size"]
            done = [[int(a), int(b)] for a, b in old.get("done", [])] if same and sized else []
        except (OSError, ValueError, TypeError):
            done = []
        if not done:
            self.part.unlink(missing_ok=True)
            self.state_path.unlink(missing_ok=True)
        self.done = done

    def _save(self, f, state: dict) -> None:
        f.flush()
        os.fsync(f.fileno())  # the bytes first: the state never claims what is not on disk
        write_bytes_atomic(self.state_path, json.dumps({**state, "done": self.done}).encode())

    def _check_space(self, need: int) -> None:
        free = shutil.disk_usage(self.out.parent).free
        if free < need:
            raise FetchError(f"{self.out.parent}: not enough disk space: the fetch needs {need / 1e9:.2f} GB, "
                             f"{free / 1e9:.2f} GB are free")

    # ----------------------------------------------------------------- download

    def _download(self, f, spans: list[tuple[int, int]], state: dict, total: int) -> None:
        self.unsaved = 0
        report(self.progress, "fetch", _covered(self.done, spans), total, "bytes", self.label)
        try:
            for a, b in spans:
                for s, e in _missing(self.done, a, b):
                    self._retrying(lambda s=s, e=e: self._fetch_range(f, s, e, state, spans, total))
        finally:
            try:
                self._save(f, state)
            except OSError:
                pass  # the last state saved stays true; a disk error is raised from the write itself

    def _fetch_range(self, f, s: int, e: int, state: dict, spans, total: int) -> None:
        start = max(s, max((b for a, b in self.done if a <= s), default=s))  # resume within the range
        if start >= e:
            return
        response, _size = self.reader.open(start, e)
        pos = [start]

        def sink(piece: bytes) -> None:
            self._write_piece(f, pos[0], piece)
            _add(self.done, pos[0], pos[0] + len(piece))
            pos[0] += len(piece)
            self.received += len(piece)
            self.unsaved += len(piece)
            if self.unsaved >= SAVE_EVERY:
                self._save(f, state)
                self.unsaved = 0
            report(self.progress, "fetch", _covered(self.done, spans), total, "bytes", self.label)

        read_exactly(response, e - start, sink, CHUNK, self.reader.url)

    def _write_piece(self, f, at: int, piece: bytes) -> None:
        end = at + len(piece)
        i = max(0, bisect_right(self.starts, at) - 1)
        while i < len(self.tensors) and self.tensors[i].start < end:
            t = self.tensors[i]
            lo, hi = max(at, t.start), min(end, t.end)
            if lo < hi:
                f.seek(self.offsets[i] + lo - t.start)
                f.write(piece[lo - at:hi - at])
            i += 1

    # ----------------------------------------------------------------- output

    def _write(self, verify: bool, keep: list[RemoteTensor]) -> None:
        try:
            with atomic_path(self.out) as tmp:
                extract_codec(self.part, tmp)
                if verify:
                    _verify(tmp, keep)
        except CodecError as exc:
            self.part.unlink(missing_ok=True)  # bytes that do not verify are not kept for a resume
            self.state_path.unlink(missing_ok=True)
            raise FetchError(f"the codec fetched from {self.reader.url} does not verify: {exc}") from exc
        except OSError as exc:
            raise _disk_error(exc, self.out) from exc


def codec_tensors(layout: HeaderLayout) -> list[RemoteTensor]:
    """The tensors ``convert --extract`` copies, after the model layer's checks on the header
    alone: a merged ``fish-speech`` file whose codec metadata and tensors fit together."""
    arch = layout.architecture
    if arch == CODEC_ARCH:
        raise ModelFileError(f"{layout.source}: already a codec-only file ({CODEC_ARCH}); download it whole")
    if arch != MERGED_ARCH:
        raise ModelFileError(f"{layout.source}: not an S2 Pro merged GGUF: general.architecture is {arch!r}, "
                             f"expected {MERGED_ARCH!r}")
    keep = [t for t in layout.tensors if t.name.startswith(MERGED_PREFIX) and not t.name.endswith(BUFFER_SUFFIXES)]
    if not keep:
        raise ModelFileError(f"{layout.source}: no codec tensors (names starting with {MERGED_PREFIX!r})")
    mf = layout.model_file(keep)
    config = CodecConfig.from_metadata(mf.metadata)
    check_tensors(mf, expected_tensors(config, ffn_width_reader(mf, MERGED_PREFIX)), MERGED_PREFIX)
    return keep


def _verify(path: Path, keep: list[RemoteTensor]) -> None:
    mf = ModelFile.open(path)
    want = [(t.name.removeprefix(MERGED_PREFIX), t.ggml_type, t.ne, t.nbytes) for t in keep]
    got = [(t.name, t.ggml_type, t.ne, t.nbytes) for t in mf.tensors.values()]
    if got != want:
        wrong = next((w, g) for w, g in zip(want + [None] * len(got), got + [None] * len(want)) if w != g)
        raise ModelFileError(f"written file differs from the remote tensor table: expected {wrong[0]}, got {wrong[1]}")
    with load(path, backend="cpu", strict_backend=True):
        pass


def _disk_error(exc: OSError, path: Path) -> OSError:
    if isinstance(exc, FetchError):
        return exc
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return FetchError(f"{path}: no space left on the device; free some space and run the fetch again "
                          "(it resumes), or delete the .part file")
    return FetchError(f"{path}: cannot write ({exc.strerror or exc})")


# --------------------------------------------------------------------------- byte ranges


def merge_ranges(ranges: list[tuple[int, int]], gap: int = 0) -> list[tuple[int, int]]:
    """Sorted ``[start, end)`` ranges with those at most ``gap`` bytes apart joined."""
    out: list[list[int]] = []
    for s, e in sorted(ranges):
        if out and s - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _add(done: list[list[int]], s: int, e: int) -> None:
    if done and done[-1][0] <= s <= done[-1][1]:  # the common case: growing the last range
        done[-1][1] = max(done[-1][1], e)
        return
    done[:] = [list(r) for r in merge_ranges([*map(tuple, done), (s, e)])]


def _covered(done: list[list[int]], spans) -> int:
    return sum(max(0, min(b, e) - max(a, s)) for s, e in spans for a, b in done)


def _missing(done: list[list[int]], a: int, b: int) -> list[tuple[int, int]]:
    out, pos = [], a
    for s, e in sorted(done):
        if e <= pos or s >= b:
            continue
        if s > pos:
            out.append((pos, s))
        pos = max(pos, e)
    if pos < b:
        out.append((pos, b))
    return out
