"""``--help`` held consistent: every command has a description, no help text stops mid-sentence,
every option with a default states it, and options mean the same in every command (``--json``
prints to stdout, ``-q`` / ``-v`` exist everywhere, ``--pad-to`` only where it applies)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyggml_codec.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
DANGLING = {"a", "an", "and", "as", "at", "by", "for", "from", "in", "into", "of", "on", "or", "than", "that",
            "the", "to", "when", "where", "with", "would", "is", "are", "be"}
NO_DEFAULT_ACTIONS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction,
                      argparse._HelpAction, argparse._VersionAction, argparse.BooleanOptionalAction)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _commands() -> dict[str, argparse.ArgumentParser]:
    return _subparsers(cli_main.get_parser())


def mid_sentence(text: str) -> str | None:
    """Why ``text`` reads as cut off (None when it does not)."""
    text = " ".join(text.split())
    if text.count("(") != text.count(")"):
        return "unbalanced parentheses"
    if re.search(r"[,;:(\-]$", text):
        return f"ends with {text[-1]!r}"
    last = re.findall(r"[A-Za-z']+", text)
    if last and last[-1] in DANGLING:  # lower case: "A", a metavar, may close a sentence
        return f"ends with the word {last[-1]!r}"
    return None


@pytest.mark.parametrize("text, cut", [("Serve voices: producer threads emit frames as a language model would,", True),
                                       ("a tone (default 2", True), ("the length of the", True),
                                       ("audio file (default: 2)", False), ("write FILE as --json-out does", False)])
def test_the_mid_sentence_check_can_fail(text, cut):
    assert (mid_sentence(text) is not None) == cut


def test_every_command_has_a_description_and_whole_help_texts():
    problems = []
    for name, parser in _commands().items():
        if not (parser.description or "").strip():
            problems.append(f"{name}: no description")
        elif why := mid_sentence(parser.description):
            problems.append(f"{name} description: {why}")
        for action in parser._actions:
            if action.help in (None, argparse.SUPPRESS):
                if action.option_strings or action.dest != "help":
                    problems.append(f"{name} {action.option_strings or action.dest}: no help")
                continue
            if why := mid_sentence(action.help):
                problems.append(f"{name} {action.option_strings or action.dest}: {why}")
    assert not problems, "\n".join(problems)


def test_every_option_with_a_default_states_it():
    missing = []
    for name, parser in _commands().items():
        for action in parser._actions:
            if not action.option_strings or isinstance(action, NO_DEFAULT_ACTIONS) or action.required:
                continue
            if action.default in (None, argparse.SUPPRESS):
                continue
            if "default" not in (action.help or ""):
                missing.append(f"{name} {action.option_strings[-1]} (default {action.default!r})")
    assert not missing, "\n".join(missing)


def test_options_mean_the_same_everywhere(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps at COLUMNS: the phrases below stay whole
    commands = _commands()
    for name, parser in commands.items():
        options = {s: a for a in parser._actions for s in a.option_strings}
        assert {"-q", "-v"} <= set(options), f"{name} lacks -q or -v"
        assert options["-q"].dest == "quiet" and options["-v"].dest == "verbose", name
        if "--json" in options:
            assert options["--json"].const is True or isinstance(options["--json"], argparse._StoreTrueAction), name
            assert "stdout" in options["--json"].help, name
    with_pad = {n for n, p in commands.items() if any("--pad-to" in a.option_strings for a in p._actions)}
    assert with_pad == {"encode", "roundtrip", "demo"}
    helps = {n: p.format_help() for n, p in commands.items()}
    assert "--pad-to" not in helps["decode"]
    assert "(default: 0)" in helps["demo"] and "(default: npz)" in helps["encode"] and "(default: 1 actor" in helps["encode"]


def test_json_prints_to_stdout_and_json_out_writes_a_file(tiny_model, tmp_path, capsys):
    import json

    import numpy as np

    from pyggml_codec.io.codefiles import CodeFile, write_codes

    codes = np.zeros((10, 3), np.int32)
    write_codes(tmp_path / "a.npz", CodeFile(codes, sample_rate=44100))
    write_codes(tmp_path / "b.npz", CodeFile(codes, sample_rate=44100))
    a, b = str(tmp_path / "a.npz"), str(tmp_path / "b.npz")
    assert cli_main.main(["compare", a, b, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert cli_main.main(["compare", a, b, "--json-out", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True and "OK: 1 stage" in capsys.readouterr().out
    assert cli_main.main(["compare", a, b, "--json", str(tmp_path / "old.json")]) == 0  # the earlier spelling
    assert json.loads((tmp_path / "old.json").read_text())["ok"] is True
    capsys.readouterr()
    assert cli_main.main(["compare", a, b, "-q"]) == 0 and capsys.readouterr().out == ""
    assert cli_main.main(["compare", a, b, "--brief"]) == 0
    assert capsys.readouterr().out.count("\n") == 1
    assert cli_main.main(["info", str(tiny_model.f32_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["loadable"] is True


def test_serve_streams_help_is_whole():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "serve_streams.py"), "--help"],
                          capture_output=True, text=True, env=env, timeout=120, check=True)
    description = proc.stdout.split("\n\n")[1]
    assert mid_sentence(description) is None, description
    assert description.rstrip().endswith(".") and "(default: 4)" in proc.stdout
