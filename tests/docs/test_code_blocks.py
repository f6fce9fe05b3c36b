"""Every Python and shell code block of README.md and docs/ runs, on the demo model.

Each Markdown page gets a workspace (a temporary folder) seeded with the files the docs name:

* ``s2-codec.gguf``: the demo model (``pyggml-codec demo`` builds it), standing in for the real
  codec file that ``pyggml-codec fetch`` writes;
* ``speech.wav``: the demo's 2 s test signal at 44.1 kHz;
* ``speech.npz``: its codes;
* ``examples/``: the repository's examples.

A page's blocks run in the order they are written, each in a fresh process (a Python block in a
fresh interpreter, a shell block in ``bash -euo pipefail``), in that page's workspace: a file one
block writes is there for the next block of the same page, names are not. A block that cannot run
in CI (a GPU, the real 1 GB model, the network, an install) is preceded by an HTML comment
``<!-- skip: reason -->`` and reported as skipped with that reason. Blocks in other languages
(``text``, ``toml``, ``yaml``, ...) are shown, not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
# Pages whose blocks record a run rather than instruct: scripts/bench.sh writes this page.
GENERATED = {"docs/performance.md"}
SKIP = re.compile(r"<!--\s*skip:\s*(?P<reason>.+?)\s*-->")
FENCE = re.compile(r"^(?P<indent>[ ]{0,4})(?P<fence>```+|~~~+)\s*(?P<info>[^`\s]*)[^`]*$")
TIMEOUT_S = 300  # a hang guard only: every block takes seconds on the demo model


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


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONWARNINGS"] = "ignore"  # the demo model's warnings are not what a block checks
    bindir = str(Path(sys.executable).parent)  # pyggml-codec of the running environment
    env["PATH"] = os.pathsep.join((bindir, env.get("PATH", "")))
    return env


def _workspace(page: str, seed: Path, tmp_path_factory) -> Path:
    if page not in _WORKSPACES:
        ws = tmp_path_factory.mktemp("docs_" + re.sub(r"\W", "_", page))
        shutil.copytree(seed, ws, dirs_exist_ok=True)
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
def test_code_block(block: Block, seed: Path, tmp_path_factory):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    ws = _workspace(block.page, seed, tmp_path_factory)
    if block.language == "python":
        cmd = [sys.executable, "-c", block.code]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    proc = subprocess.run(cmd, cwd=ws, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{block.id} ({block.language}) exited {proc.returncode}\n--- code\n{block.code}"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
