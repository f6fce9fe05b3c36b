"""``fetch``: the codec of a merged GGUF over HTTP range requests, against a server on 127.0.0.1.

The server serves merged ``fish-speech`` fixtures (the tiny codec under ``c.`` with
language-model tensors before, between and after it) and records every byte range it sent,
so the tests prove that only the header and the codec's tensors were downloaded.
"""

from __future__ import annotations

import errno
import http.server
import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

import pyggml_codec
from pyggml_codec.cli import main as cli_main
from pyggml_codec.errors import FetchError, ModelFileError
from pyggml_codec.model import convert
from pyggml_codec.model.gguf_header import HeaderIncomplete, parse_header
from pyggml_codec.model.gguf_write import MetaValue, TensorData, copy_tensor, write_gguf
from pyggml_codec.hub import fetch as fetch_mod

PATH = "/owner/name/resolve/main/merged.gguf"
BIG = 1 << 20  # bytes of each language-model tensor: far more than the codec's spans


class Server:
    """A threaded HTTP server of byte strings, with switches for the failure cases."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.redirects = dict(files), {}
        self.ranges, self.status, self.etag = True, None, '"v1"'
        self.truncate_after = None  # every 206 body from byte cut_from on stops after this many bytes
        self.cut_from = 0
        self.drop_once_after = None  # the next 206 body stops after this many bytes, once
        self.served: list[tuple[str, int, int]] = []  # (path, start, end) of each body, in sending order
        self.headers: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.handle(self)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = PATH, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    @property
    def served_bytes(self) -> int:
        return sum(e - s for _p, s, e in self.served)

    def handle(self, h) -> None:
        with self.lock:
            self.headers.append((h.path, dict(h.headers)))
        if h.path in self.redirects:
            h.send_response(302)
            h.send_header("Location", self.redirects[h.path])
            h.send_header("X-Linked-Etag", '"linked-sha"')
            h.end_headers()
            return
        data = self.files.get(h.path)
        if self.status is not None or data is None:
            h.send_error(self.status or 404)
            return
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", h.headers.get("Range", ""))
        if not self.ranges or not match:
            start, end = 0, len(data)
            h.send_response(200)
        else:
            start, end = int(match.group(1)), min(int(match.group(2)) + 1, len(data))
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        h.send_header("Content-Length", str(end - start))
        h.send_header("ETag", self.etag)
        h.end_headers()
        cut = end
        if self.ranges and match and start >= self.cut_from:
            with self.lock:
                limit = self.truncate_after
                if self.drop_once_after is not None:
                    limit, self.drop_once_after = self.drop_once_after, None
            cut = end if limit is None else min(end, start + limit)
        # Recorded before the body goes out: the client may read it and send its next request
        # before this thread runs again, so a record made after the write can land out of order.
        with self.lock:
            self.served.append((h.path, start, cut))
        try:
            h.wfile.write(data[start:cut])
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return
        if cut < end:
            h.close_connection = True

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _merged(codec: Path, out: Path, lm_first: bool = True) -> Path:
    """A merged file: LM tensors before, between and after the codec's; a codec buffer too."""
    reader = GGUFReader(str(codec))
    rng = np.random.default_rng(1)
    big = lambda: rng.standard_normal(BIG // 4).astype(np.float32).reshape(-1, 256)  # noqa: E731
    codec_tensors = [copy_tensor(t, "c." + t.name) for t in reader.tensors]
    half = len(codec_tensors) // 2
    tensors = [TensorData("token_embd.weight", big())] if lm_first else []
    tensors += codec_tensors[:half] + [TensorData("blk.0.attn_q.weight", big())] + codec_tensors[half:]
    tensors += [TensorData("c.quantizer.pre_module.freqs_cis", rng.standard_normal((4, 2, 2)).astype(np.float32)),
                TensorData("output.weight", big())]
    meta = [MetaValue("general.name", "merged test file", GGUFValueType.STRING),
            MetaValue("tokenizer.ggml.tokens", [f"tok{i}" for i in range(3000)], GGUFValueType.ARRAY,
                      GGUFValueType.STRING),
            *[convert.copy_field(reader, k) for k in reader.fields if k.startswith("fish_speech.codec.")]]
    return write_gguf(out, convert.MERGED_ARCH, meta, tensors)


@pytest.fixture(scope="module")
def merged(tiny_model, tmp_path_factory) -> tuple[bytes, bytes]:
    """(merged file bytes, what ``convert --extract`` writes from it)."""
    folder = tmp_path_factory.mktemp("merged")
    path = _merged(tiny_model.f16_path, folder / "merged.gguf")
    ref = convert.extract_codec(path, folder / "extracted.gguf")
    return path.read_bytes(), ref.read_bytes()


@pytest.fixture()
def server(merged, monkeypatch):
    monkeypatch.setattr(fetch_mod, "HEADER_FIRST_BYTES", 4096)
    monkeypatch.setattr(fetch_mod, "RETRY_BACKOFF_S", 0.0)
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    srv = Server({PATH: merged[0]})
    yield srv
    srv.close()


def _codec_ranges(data: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    layout = parse_header(data, len(data))
    keep = fetch_mod.codec_tensors(layout)
    other = [(t.start, t.end) for t in layout.tensors if t not in keep]
    return [(t.start, t.end) for t in keep], other, layout.header_end


def _check_only_codec_served(server: Server, data: bytes, resumed_from: int = 0) -> None:
    codec, other, header_end = _codec_ranges(data)
    header = [(s, e) for _p, s, e in server.served if s < header_end]
    body = [(s, e) for _p, s, e in server.served if s >= header_end]
    assert header and header[0][0] == 0 and max(e for _s, e in header) <= 2 * header_end + 4096
    for s, e in body:
        assert not any(s < oe and os < e for os, oe in other), "a non-codec tensor was downloaded"
    gaps = sum(b[0] - a[1] for a, b in zip(codec, codec[1:]) if b[0] - a[1] <= fetch_mod.MERGE_GAP)
    codec_bytes = sum(e - s for s, e in codec)
    assert codec_bytes - resumed_from <= sum(e - s for s, e in body) <= codec_bytes - resumed_from + gaps
    assert server.served_bytes < len(data) - 2 * BIG


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_fetch_writes_what_convert_extract_writes(server, merged, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")  # for the Hub's host only, not for this URL
    seen = []
    out = pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf", progress=seen.append)
    assert out.read_bytes() == merged[1]
    assert not any("Authorization" in h for _p, h in server.headers)
    _check_only_codec_served(server, merged[0])
    assert _leftovers(tmp_path) == ["codec.gguf"]  # no .part, no state, no temp file
    assert seen and {p.task for p in seen} == {"fetch"} and {p.unit for p in seen} == {"bytes"}
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert seen[-1].done == seen[-1].total and seen[-1].detail == "merged.gguf"
    with pyggml_codec.load(out, backend="cpu") as codec:
        assert codec.config.n_codebooks == 10


def test_header_range_grows_until_the_tensor_table_parses(server, merged, tmp_path, monkeypatch):
    monkeypatch.setattr(fetch_mod, "HEADER_FIRST_BYTES", 64)
    out = pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf", verify=False)
    assert out.read_bytes() == merged[1]
    _, _, header_end = _codec_ranges(merged[0])
    assert len([s for _p, s, _e in server.served if s < header_end]) > 5


def test_server_without_range_support(server, tmp_path):
    server.ranges = False
    with pytest.raises(FetchError, match="does not support HTTP range requests"):
        pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf")
    assert _leftovers(tmp_path) == []


def test_not_found(server, tmp_path):
    with pytest.raises(FetchError, match=r"not found \(HTTP 404\)"):
        pyggml_codec.fetch(server.url("/nope.gguf"), output=tmp_path / "codec.gguf")
    server.status = 500
    with pytest.raises(FetchError, match="HTTP 500"):
        pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf", retries=1)
    assert _leftovers(tmp_path) == []


def test_truncated_body_then_resume(server, merged, tmp_path):
    server.truncate_after, server.cut_from = 40000, _codec_ranges(merged[0])[2]
    with pytest.raises(FetchError, match=r"truncated body: got 40000 of \d+ bytes \(after 0 retries; run the fetch again to resume\)"):
        pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf", retries=0)
    assert _leftovers(tmp_path) == ["codec.gguf.part", "codec.gguf.part.json"]  # resumable, no output
    state = json.loads((tmp_path / "codec.gguf.part.json").read_text())
    done = sum(b - a for a, b in state["done"])
    assert done > 0 and state["etag"] == "v1" and state["size"] == len(merged[0])
    server.truncate_after, server.served = None, []
    out = pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf")
    assert out.read_bytes() == merged[1]
    body = sum(e - s for _p, s, e in server.served if s >= _codec_ranges(merged[0])[2])
    assert body < sum(e - s for s, e in _codec_ranges(merged[0])[0])  # the resumed run skipped what was done
    _check_only_codec_served(server, merged[0], resumed_from=done)
    assert _leftovers(tmp_path) == ["codec.gguf"]


def test_interrupted_connection_is_retried_where_it_stopped(server, merged, tmp_path):
    server.drop_once_after, server.cut_from = 30000, _codec_ranges(merged[0])[2]
    out = pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf")
    assert out.read_bytes() == merged[1]
    _check_only_codec_served(server, merged[0])  # no byte of the codec was downloaded twice


def test_interrupted_then_resumed_by_a_second_call(server, merged, tmp_path):
    server.truncate_after, server.cut_from = 50000, _codec_ranges(merged[0])[2]
    with pytest.raises(FetchError, match="truncated body: got 50000 of"):
        pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf", retries=0)
    assert not (tmp_path / "codec.gguf").exists()
    state = json.loads((tmp_path / "codec.gguf.part.json").read_text())
    done = sum(b - a for a, b in state["done"])
    assert done == 50000
    server.truncate_after, server.served = None, []
    assert pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf").read_bytes() == merged[1]
    _check_only_codec_served(server, merged[0], resumed_from=done)


def test_a_changed_remote_file_starts_over(server, merged, tmp_path):
    server.truncate_after, server.cut_from = 50000, _codec_ranges(merged[0])[2]
    with pytest.raises(FetchError):
        pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf", retries=0)
    server.truncate_after, server.served, server.etag = None, [], '"v2"'
    assert pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf").read_bytes() == merged[1]
    _check_only_codec_served(server, merged[0])  # everything again: the ETag changed


def test_files_that_are_not_s2_merged(server, merged, tiny_model, tmp_path):
    server.files["/codec.gguf"] = Path(tiny_model.f16_path).read_bytes()
    server.files["/text.gguf"] = b"<html>not a model</html>" * 100
    llama = write_gguf(tmp_path / "llama.gguf", "llama", [], [TensorData("w", np.zeros(8, np.float32))])
    server.files["/llama.gguf"] = llama.read_bytes()
    llama.unlink()
    cases = {"/codec.gguf": "already a codec-only file", "/text.gguf": "not a GGUF file",
             "/llama.gguf": "general.architecture is 'llama', expected 'fish-speech'"}
    for path, message in cases.items():
        with pytest.raises(ModelFileError, match=message):
            pyggml_codec.fetch(server.url(path), output=tmp_path / "codec.gguf")
    assert _leftovers(tmp_path) == []
    sizes = {p: len(d) for p, d in server.files.items()}
    assert all(e <= 65536 < sizes[p] for p, _s, e in server.served if p == "/codec.gguf")  # its header only


def test_full_disk_leaves_no_output(server, merged, tmp_path, monkeypatch):
    calls = []

    def full(self, f, at, piece):
        calls.append(at)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, f, at, piece)

    real = fetch_mod._Fetch._write_piece
    monkeypatch.setattr(fetch_mod._Fetch, "_write_piece", full)
    monkeypatch.setattr(fetch_mod, "CHUNK", 4096)
    with pytest.raises(FetchError, match="no space left on the device"):
        pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf")
    assert not (tmp_path / "codec.gguf").exists()
    monkeypatch.setattr(fetch_mod._Fetch, "_write_piece", real)

    def extract_full(src, dst):
        Path(dst).write_bytes(b"GGUF partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fetch_mod, "extract_codec", extract_full)
    with pytest.raises(FetchError, match="no space left on the device"):
        pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf")
    assert _leftovers(tmp_path) == ["codec.gguf.part", "codec.gguf.part.json"]  # the temp output is gone
    monkeypatch.undo()
    monkeypatch.setattr(fetch_mod, "HEADER_FIRST_BYTES", 4096)
    server.served = []
    assert pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf").read_bytes() == merged[1]
    _, _, header_end = _codec_ranges(merged[0])
    assert all(s < header_end for _p, s, _e in server.served)  # the codec was all there already


def test_not_enough_space_is_told_before_downloading(server, tmp_path, monkeypatch):
    monkeypatch.setattr(fetch_mod.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(FetchError, match="not enough disk space"):
        pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf")
    assert _leftovers(tmp_path) == []


def test_a_file_that_does_not_load_is_not_kept(server, tmp_path, monkeypatch):
    def broken(path, **kw):
        raise ModelFileError(f"{path}: broken")

    monkeypatch.setattr(fetch_mod, "load", broken)
    with pytest.raises(FetchError, match="does not verify: .*broken"):
        pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf")
    assert _leftovers(tmp_path) == []


def test_a_second_fetch_of_the_same_output_is_refused(server, merged, tmp_path):
    with fetch_mod.output_lock(tmp_path / "codec.gguf"):
        with pytest.raises(FetchError, match="another fetch is writing it now"):
            pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf")
        assert not server.served
    assert pyggml_codec.fetch(server.url(), output=tmp_path / "codec.gguf").read_bytes() == merged[1]
    assert _leftovers(tmp_path) == ["codec.gguf"]


def test_hub_endpoint_token_and_cache(server, merged, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.port}/")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("PYGGML_CODEC_CACHE", str(tmp_path / "cache"))
    out = pyggml_codec.fetch(repo="owner/name", filename="merged.gguf")
    assert out == tmp_path / "cache" / "models--owner--name" / "main" / "merged-codec.gguf"
    assert out.read_bytes() == merged[1]
    assert {p for p, _h in server.headers} == {PATH}
    assert all(h.get("Authorization") == "Bearer hf_secret" for _p, h in server.headers)
    n = len(server.headers)
    assert pyggml_codec.fetch(repo="owner/name", filename="merged.gguf") == out  # cached: no request
    assert len(server.headers) == n
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FetchError, match="HF_HUB_OFFLINE"):
        pyggml_codec.fetch(repo="owner/name", filename="merged.gguf", revision="v2")


def test_token_file_and_no_token_across_hosts(server, merged, tmp_path, monkeypatch):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "token").write_text("hf_from_file\n")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.port}")
    server.files["/cdn/blob"] = server.files.pop(PATH)
    server.redirects[PATH] = server.url("/cdn/blob", host="localhost")
    out = pyggml_codec.fetch(repo="owner/name", filename="merged.gguf", output=tmp_path / "codec.gguf")
    assert out.read_bytes() == merged[1]
    sent = {(p, h.get("Authorization")) for p, h in server.headers}
    assert sent == {(PATH, "Bearer hf_from_file"), ("/cdn/blob", None)}
    assert [p for p, _h in server.headers].count(PATH) == 1  # later ranges go to the resolved URL
    assert (tmp_path / "hf" / "pyggml_codec").exists() is False  # an explicit output: nothing in the cache


def test_cli_fetch(server, merged, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYGGML_CODEC_CACHE", str(tmp_path / "cache"))
    assert cli_main.main(["fetch", server.url(), "--no-progress"]) == 0
    cached = Path(capsys.readouterr().out.strip())
    assert cached == fetch_mod.default_output(server.url()) and cached.read_bytes() == merged[1]
    assert cli_main.main(["fetch", server.url()]) == 0
    assert "already fetched" in capsys.readouterr().err
    out = tmp_path / "codec.gguf"
    assert cli_main.main(["fetch", server.url(), "-o", str(out), "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes() == merged[1]
    assert cli_main.main(["fetch", server.url(), "-o", str(out)]) == 1
    assert "exists (use --force" in capsys.readouterr().err
    assert cli_main.main(["fetch", server.url(), "-o", str(out), "--force", "--progress", "-q"]) == 0
    assert cli_main.main(["fetch", server.url("/missing.gguf"), "-o", str(tmp_path / "x.gguf")]) == 1
    assert "HTTP 404" in capsys.readouterr().err
    assert cli_main.main(["fetch", server.url(), "--repo", "a/b"]) == 2
    assert "either URL or --repo" in capsys.readouterr().err
    assert cli_main.main(["fetch", server.url(), "-o", str(tmp_path / "y.gguf"), "--progress"]) == 0
    assert "fetch" in capsys.readouterr().err  # the tqdm bar


def test_prefixes_of_a_header_parse_or_ask_for_more(merged):
    data = merged[0]
    full = parse_header(data, len(data))
    for n in list(range(0, 200)) + list(range(full.header_end - 50, full.header_end + 1)):
        try:
            layout = parse_header(data[:n], len(data))
        except HeaderIncomplete as exc:
            assert n < exc.needed <= full.header_end
        else:
            assert n >= full.header_end and layout == full
    with pytest.raises(ModelFileError, match="the file holds at most 5"):
        parse_header(data[:100], 100)
    cut = full.kv_spans["tokenizer.ggml.tokens"][1] - 3
    with pytest.raises(ModelFileError, match="string in 'tokenizer.ggml.tokens' claims 7 bytes; only 4 left"):
        parse_header(data[:cut], cut)


def test_hub_url_and_token_precedence(tmp_path, monkeypatch):
    from pyggml_codec.hub import endpoint as hub

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    assert hub.hub_url("o/n", "dir/a b.gguf", "refs/pr/1") == \
        "https://huggingface.co/o/n/resolve/refs%2Fpr%2F1/dir/a%20b.gguf"
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example/")
    assert hub.hub_url("o/n", "f.gguf") == "https://mirror.example/o/n/resolve/main/f.gguf"
    for bad in ("noslash", "a/b/c", "/n"):
        with pytest.raises(ValueError, match="owner/name"):
            hub.hub_url(bad, "f.gguf")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub.hub_token() is None
    (tmp_path / "token").write_text("from_file\n")
    assert hub.hub_token() == "from_file"
    monkeypatch.setenv("HF_TOKEN", "from_env")
    assert hub.hub_token() == "from_env" and hub.hub_token("given") == "given" and hub.hub_token(False) is None
    with pytest.raises(ValueError, match="http"):
        pyggml_codec.fetch("ftp://host/x.gguf", output=tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="either a URL or repo"):
        pyggml_codec.fetch("https://host/x.gguf", repo="o/n")
    with pytest.raises(FetchError, match="no such directory"):
        pyggml_codec.fetch("https://host/x.gguf", output=tmp_path / "missing" / "x.gguf")


def test_unknown_host_fails_without_retrying(tmp_path, monkeypatch):
    def no_retry(seconds):
        raise AssertionError("retried an unknown host")

    monkeypatch.setattr(fetch_mod.time, "sleep", no_retry)
    with pytest.raises(FetchError, match=r"cannot read http://no-such-host\.invalid/x\.gguf: .*"):
        pyggml_codec.fetch("http://no-such-host.invalid/x.gguf", output=tmp_path / "x.gguf")
    assert _leftovers(tmp_path) == []
