"""Every Python and shell code block of README.md and docs/ runs, on the demo model.

Each Markdown page gets a workspace (a temporary folder) seeded with the files the docs name:

* ``s2-codec.gguf``: the demo model (``pyggml-codec demo`` builds it), standing in for the real
  codec file that ``pyggml-codec fetch`` writes;
* ``speech.wav``: the demo's 2 s test signal at 44.1 kHz;
* ``speech.npz``: its codes;
* ``examples/``: the repository's examples.

``fetch`` runs against a local Hub: every block sees ``HF_ENDPOINT`` pointing at a server on
127.0.0.1 that serves a merged ``fish-speech`` file made from the demo model (language-model
tensors around the codec's ``c.*`` ones) as ``rodrigomt/s2-pro-gguf``'s ``s2-pro-f16.gguf``, with
range requests, and ``HF_HOME`` pointing at an empty folder. A page with a block that fetches
starts without ``s2-codec.gguf``, so its first fetch really downloads it.

A page's blocks run in the order they are written, each in a fresh process (a Python block in a
fresh interpreter, a shell block in ``bash -euo pipefail``), in that page's workspace: a file one
block writes is there for the next block of the same page, names are not. A block that cannot run
in CI (a GPU, the real 1 GB model, the network, an install) is preceded by an HTML comment
``<!-- skip: reason -->`` and reported as skipped with that reason. Blocks in other languages
(``text``, ``toml``, ``yaml``, ...) are shown, not run.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
# Pages whose blocks record a run rather than instruct: scripts/bench.sh writes this page.
GENERATED = {"docs/performance.md"}
SKIP = re.compile(r"<!--\s*skip:\s*(?P<reason>.+?)\s*-->")
FENCE = re.compile(r"^(?P<indent>[ ]{0,4})(?P<fence>```+|~~~+)\s*(?P<info>[^`\s]*)[^`]*$")
TIMEOUT_S = 300  # a hang guard only: every block takes seconds on the demo model
FETCHES = re.compile(r"pyggml-codec fetch|pyggml_codec\.fetch\(")
HUB_PATH = "/rodrigomt/s2-pro-gguf/resolve/main/s2-pro-f16.gguf"  # fetch's default source


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    language: str  # "python" or "bash"
    code: str
    skip: str | None  # the reason, when marked

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    found = [ROOT / "README.md"]
    found += sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
    return [p for p in found if p.relative_to(ROOT).as_posix() not in GENERATED]


def parse_blocks(text: str, page: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order, with the skip mark before each."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, start = m.group("fence"), len(m.group("indent")), i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1
        language = RUN_LANGUAGES.get(m.group("info").lower())
        if language is None:
            continue
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        mark = SKIP.search(lines[before]) if before >= 0 else None
        blocks.append(Block(page, start + 1, language, "\n".join(body) + "\n",
                            mark.group("reason") if mark else None))
    return blocks


def all_blocks() -> list[Block]:
    blocks = []
    for path in pages():
        blocks += parse_blocks(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    return blocks


BLOCKS = all_blocks()
_WORKSPACES: dict[str, Path] = {}


@pytest.fixture(scope="session")
def seed(tmp_path_factory) -> Path:
    """The files every workspace starts with, made once by ``pyggml-codec demo``."""
    folder = tmp_path_factory.mktemp("docs_seed")
    demo = folder / "demo"
    subprocess.run([sys.executable, "-m", "pyggml_codec", "demo", "-o", str(demo), "-q"],
                   check=True, env=_env(), cwd=folder, timeout=TIMEOUT_S)
    shutil.copy(demo / "demo_codec.gguf", folder / "s2-codec.gguf")
    shutil.copy(demo / "input.wav", folder / "speech.wav")
    shutil.copy(demo / "codes.npz", folder / "speech.npz")
    shutil.rmtree(demo)
    shutil.copytree(ROOT / "examples", folder / "examples")
    return folder


def _merged_demo(codec: Path, out: Path) -> bytes:
    """A merged ``fish-speech`` file: the demo codec under ``c.`` between language-model tensors."""
    from gguf import GGUFReader, GGUFValueType

    from pyggml_codec.model.convert import MERGED_ARCH
    from pyggml_codec.model.gguf_write import MetaValue, TensorData, copy_field, copy_tensor, write_gguf

    reader = GGUFReader(str(codec))
    lm = np.zeros((256, 256), np.float32)
    tensors = [TensorData("token_embd.weight", lm)]
    tensors += [copy_tensor(t, "c." + t.name) for t in reader.tensors]
    tensors += [TensorData("output.weight", lm)]
    meta = [MetaValue("general.name", "merged demo file", GGUFValueType.STRING),
            *[copy_field(reader, k) for k in reader.fields if k.startswith("fish_speech.codec.")]]
    return write_gguf(out, MERGED_ARCH, meta, tensors).read_bytes()


@pytest.fixture(scope="session")
def hub(seed, tmp_path_factory):
    """A local Hub serving the merged demo file with range requests; yields its endpoint URL."""
    data = _merged_demo(seed / "s2-codec.gguf", tmp_path_factory.mktemp("hub") / "merged.gguf")

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path != HUB_PATH:
                self.send_error(404)
                return
            match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            start, end = (int(match.group(1)), min(int(match.group(2)) + 1, len(data))) if match else (0, len(data))
            self.send_response(206 if match else 200)
            if match:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.send_header("Content-Length", str(end - start))
            self.send_header("ETag", '"demo"')
            self.end_headers()
            self.wfile.write(data[start:end])

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _env(hub: str | None = None, hf_home: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "PYGGML_CODEC_CACHE"):
        env.pop(name, None)
    if hub is not None:
        env["HF_ENDPOINT"] = hub
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONWARNINGS"] = "ignore"  # the demo model's warnings are not what a block checks
    bindir = str(Path(sys.executable).parent)  # pyggml-codec of the running environment
    env["PATH"] = os.pathsep.join((bindir, env.get("PATH", "")))
    return env


def _workspace(page: str, seed: Path, tmp_path_factory) -> Path:
    if page not in _WORKSPACES:
        ws = tmp_path_factory.mktemp("docs_" + re.sub(r"\W", "_", page))
        shutil.copytree(seed, ws, dirs_exist_ok=True)
        if any(FETCHES.search(b.code) for b in BLOCKS if b.page == page and not b.skip):
            (ws / "s2-codec.gguf").unlink()  # the page's first fetch writes it
        _WORKSPACES[page] = ws
    return _WORKSPACES[page]


def test_blocks_were_collected():
    """The collector finds the pages' blocks; prints how many run and how many are skipped, and why."""
    skipped = [b for b in BLOCKS if b.skip]
    print(f"\ndocs code blocks: {len(BLOCKS)} collected, {len(BLOCKS) - len(skipped)} run, {len(skipped)} skipped")
    for b in skipped:
        print(f"  skipped {b.id}: {b.skip}")
    assert any(b.page == "README.md" for b in BLOCKS)
    assert len(BLOCKS) - len(skipped) >= 2 * len(skipped), "most blocks must run"


def test_parser_reads_marks_and_fences():
    text = ("x\n\n<!-- skip: needs a GPU -->\n```bash\necho no\n```\n\n```python\nprint(1)\n```\n"
            "```text\nnot run\n```\n- item\n\n    ```py\n    a = 1\n    ```\n")
    blocks = parse_blocks(text, "t.md")
    assert [(b.language, b.skip, b.code) for b in blocks] == [
        ("bash", "needs a GPU", "echo no\n"), ("python", None, "print(1)\n"), ("python", None, "a = 1\n")]
    assert [b.line for b in blocks] == [4, 8, 16]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_code_block(block: Block, seed: Path, hub: str, tmp_path_factory):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    ws = _workspace(block.page, seed, tmp_path_factory)
    if block.language == "python":
        cmd = [sys.executable, "-c", block.code]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    hf_home = ws.parent / (ws.name + "_hf_home")
    hf_home.mkdir(exist_ok=True)
    env = _env(hub, hf_home)
    proc = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{block.id} ({block.language}) exited {proc.returncode}\n--- code\n{block.code}"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
