"""HTTP range reads of one remote file, and the Hugging Face Hub's conventions (standard library only).

The Hub's environment is honoured as ``huggingface_hub`` reads it:

- ``HF_ENDPOINT``: the Hub or a mirror (default ``https://huggingface.co``); a file's URL is
  ``{endpoint}/{repo}/resolve/{revision}/{filename}``;
- ``HF_TOKEN`` (or the older ``HUGGING_FACE_HUB_TOKEN``), else the token file
  ``huggingface-cli login`` writes (``HF_TOKEN_PATH``, default ``$HF_HOME/token``); it is sent
  as ``Authorization: Bearer ...`` to the endpoint's host only, never across a redirect to
  another host (the Hub redirects downloads to a CDN with signed URLs);
- ``HF_HOME`` (default ``$XDG_CACHE_HOME/huggingface``, i.e. ``~/.cache/huggingface``);
- ``HF_HUB_OFFLINE``: no network at all.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .._version import __version__
from ..errors import FetchError

DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_REDIRECTS = 10
REDIRECTS = (301, 302, 303, 307, 308)
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)


def hf_home() -> Path:
    """``HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``."""
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(cache).expanduser() / "huggingface"


def hub_endpoint(endpoint: str | None = None) -> str:
    """``endpoint``, else ``HF_ENDPOINT``, else the Hub; without a trailing slash."""
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_token(token: str | bool | None = None) -> str | None:
    """The token to send: ``token`` itself when a string, none when False, else ``HF_TOKEN``
    (or ``HUGGING_FACE_HUB_TOKEN``), else the token file (``HF_TOKEN_PATH`` or ``$HF_HOME/token``)."""
    if token is False:
        return None
    if isinstance(token, str):
        return token.strip() or None
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(var, "").strip():
            return os.environ[var].strip()
    path = Path(os.environ.get("HF_TOKEN_PATH") or hf_home() / "token").expanduser()
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_url(repo: str, filename: str, revision: str = "main", endpoint: str | None = None) -> str:
    """``{endpoint}/{repo}/resolve/{revision}/{filename}``, each part quoted."""
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"repo must be 'owner/name', got {repo!r}")
    if not filename or filename.startswith("/"):
        raise ValueError(f"filename must be a path inside the repository, got {filename!r}")
    quote = urllib.parse.quote
    return f"{hub_endpoint(endpoint)}/{quote(repo)}/resolve/{quote(revision, safe='')}/{quote(filename)}"


@dataclass(frozen=True)
class Identity:
    """What identifies one version of the remote file: its size and, when the server gives
    one, its ETag (on the Hub: ``X-Linked-Etag``, the file's sha256, else ``ETag``)."""

    size: int
    etag: str | None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 - urllib hook
        return None  # followed by RangeReader itself, to drop the token across hosts


def _etag(headers) -> str | None:
    value = headers.get("X-Linked-Etag") or headers.get("ETag")
    return value.removeprefix("W/").strip('"') if value else None


class RangeReader:
    """Byte ranges of the file at ``url`` over HTTP(S) range requests.

    Redirects are followed here (at most MAX_REDIRECTS); the final URL is kept for later
    ranges and resolved again when it stops working (the Hub's signed URLs expire). A server
    that answers a range request with the whole file is refused: nothing is downloaded then.
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0):
        self.url, self.token, self.timeout = url, token, timeout
        self.auth_host = urllib.parse.urlsplit(url).netloc
        self.resolved: str | None = None
        self.identity: Identity | None = None
        self._opener = urllib.request.build_opener(_NoRedirect())

    def _request(self, url: str, start: int, end: int):
        headers = {"Range": f"bytes={start}-{end - 1}", "User-Agent": f"pyggml_codec/{__version__}",
                   "Accept-Encoding": "identity"}
        if self.token and urllib.parse.urlsplit(url).netloc == self.auth_host:
            headers["Authorization"] = f"Bearer {self.token}"
        return self._opener.open(urllib.request.Request(url, headers=headers), timeout=self.timeout)

    def open(self, start: int, end: int) -> tuple[http.client.HTTPResponse, int]:
        """An open response whose body is bytes [start, min(end, size)); and the file size.

        Raises FetchError (``transient`` set for what a retry may cure: 5xx, 429, resets,
        time-outs) on any failure."""
        if self.resolved is not None:
            try:
                return self._follow(self.resolved, start, end)
            except FetchError as exc:
                if getattr(exc, "status", None) not in (401, 403, 404, 410):
                    raise
                self.resolved = None  # an expired signed URL: resolve again from the start
        return self._follow(self.url, start, end)

    def _follow(self, url: str, start: int, end: int):
        linked: dict[str, str] = {}
        for _ in range(MAX_REDIRECTS + 1):
            try:
                response = self._request(url, start, end)
            except urllib.error.HTTPError as exc:
                if exc.code in REDIRECTS and exc.headers.get("Location"):
                    for key in ("X-Linked-Etag", "X-Linked-Size"):
                        if exc.headers.get(key) and key not in linked:
                            linked[key] = exc.headers[key]
                    url = urllib.parse.urljoin(url, exc.headers["Location"])
                    exc.close()
                    continue
                exc.close()
                raise self._status_error(exc.code, exc.reason, url) from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                reason = getattr(exc, "reason", exc)
                error = FetchError(f"cannot read {self._name(url)}: {reason}")
                raise (error if isinstance(reason, socket.gaierror) else _transient(error)) from None  # no such host
            return self._check(response, url, start, end, linked), self.identity.size
        raise FetchError(f"{self.url}: more than {MAX_REDIRECTS} redirects")

    def _check(self, response, url: str, start: int, end: int, linked: dict[str, str]):
        if response.status != 206:
            response.close()
            if response.status == 200:
                raise FetchError(
                    f"{self._name(url)}: the server does not support HTTP range requests (it answered a range "
                    "request with the whole file); fetch reads only the codec's bytes and needs them")
            raise self._status_error(response.status, response.reason, url)
        match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if not match or match.group(3) == "*":
            response.close()
            raise FetchError(f"{self._name(url)}: bad Content-Range {response.headers.get('Content-Range')!r}")
        first, last, size = int(match.group(1)), int(match.group(2)), int(match.group(3))
        if first != start or last != min(end, size) - 1:
            response.close()
            raise FetchError(f"{self._name(url)}: asked for bytes {start}-{end - 1}, got {first}-{last}/{size}")
        if self.identity is None:  # the first answer names the version; later ones may come from a CDN
            self.identity = Identity(size, _etag(linked) or _etag(response.headers))
        elif size != self.identity.size:
            response.close()
            raise FetchError(f"{self.url} changed during the download (its size went from {self.identity.size} "
                             f"to {size} bytes); run the fetch again")
        self.resolved = url
        return response

    def _name(self, url: str) -> str:
        return self.url if url == self.url else f"{self.url} (redirected to {urllib.parse.urlsplit(url).netloc})"

    def _status_error(self, status: int, reason: str, url: str) -> FetchError:
        name = self._name(url)
        if status == 404:
            exc = FetchError(f"{name}: not found (HTTP 404); check the repository, file name and revision")
        elif status in (401, 403):
            hint = "" if self.token else "; a gated or private repository needs a token (HF_TOKEN or huggingface-cli login)"
            exc = FetchError(f"{name}: access denied (HTTP {status} {reason}){hint}")
        elif status == 416:
            exc = FetchError(f"{name}: range not satisfiable (HTTP 416): the file is shorter than its header says")
        else:
            exc = FetchError(f"{name}: HTTP {status} {reason}")
            if status >= 500 or status == 429:
                _transient(exc)
        exc.status = status
        return exc


def _transient(exc: FetchError) -> FetchError:
    exc.transient = True
    return exc


def read_exactly(response, n: int, sink, chunk: int = 1 << 20, source: str = "") -> int:
    """Read the ``n`` bytes of ``response``'s body, handing each piece to ``sink(bytes)``;
    a body that ends early is a transient FetchError naming how far it got."""
    got = 0
    try:
        while got < n:
            try:
                piece = response.read(min(chunk, n - got))
            except (http.client.HTTPException, socket.timeout, ConnectionError) as exc:
                raise _transient(FetchError(f"{source}: connection lost after {got} of {n} bytes ({exc})")) from None
            if not piece:
                raise _transient(FetchError(f"{source}: truncated body: got {got} of {n} bytes"))
            sink(piece)
            got += len(piece)
    finally:
        response.close()
    return got
