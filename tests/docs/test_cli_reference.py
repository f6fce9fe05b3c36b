"""The CLI reference page is written from the parsers at build time (docs/hooks/cli_reference.py)."""

from __future__ import annotations

from pathlib import Path

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


def test_the_page_names_no_folder_of_the_build_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    text = _hook().cli_markdown()
    assert str(Path.home()) not in text and str(tmp_path) not in text
    assert "~/.cache/huggingface/pyggml_codec" in text

