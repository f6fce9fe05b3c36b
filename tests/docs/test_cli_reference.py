"""The CLI reference page is written from the parsers at build time (docs/hooks/cli_reference.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from devscripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _hook():
    return load_script("docs/hooks/cli_reference.py")


def test_every_command_and_option_is_on_the_page():
    from pyggml_codec.cli.main import get_parser

    hook = _hook()
    text = hook.cli_markdown()
    parser = get_parser()
    for name, sub, _ in hook._subcommands(parser):
        assert f"\n## {name}\n" in text, name
        for action in sub._actions:
            for flag in action.option_strings:
                assert f"`{flag}`" in text, (name, flag)


def test_the_marker_is_replaced_and_other_pages_are_left_alone():
    hook = _hook()
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert hook.MARKER in page
    out = hook.on_page_markdown(page, None, None, None)
    assert hook.MARKER not in out and "## encode" in out
    assert hook.on_page_markdown("# other", None, None, None) == "# other"


@pytest.mark.parametrize("home", ["tmp", "/"])
def test_the_page_names_no_folder_of_the_build_machine(monkeypatch, tmp_path, home):
    """Whatever the build machine's home (a folder, or "/" as in some containers) and HF_HOME."""
    home = str(tmp_path / "home") if home == "tmp" else home
    monkeypatch.setenv("HOME", home)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    text = _hook().cli_markdown()
    assert str(tmp_path) not in text and "~/.cache/huggingface/pyggml_codec" in text
    assert text.count("~") == text.count("~/")  # only the home folder became "~", no other "/"
    assert os.environ["HOME"] == home  # restored


def test_the_page_leaves_the_environment_as_it_found_it(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    _hook().cli_markdown()
    assert "COLUMNS" not in os.environ and os.environ["HF_ENDPOINT"] == "http://127.0.0.1:9"

