"""MkDocs hook: the CLI reference page, written from the argparse parsers at build time.

``docs/reference/cli.md`` holds the marker ``<!-- cli-reference -->``; this hook replaces it with
one section per command, made from ``pyggml_codec.cli.main.get_parser()``, so the page always says
what ``pyggml-codec COMMAND --help`` says. Run ``python docs/hooks/cli_reference.py`` to print it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the checkout's package, also when it is not installed
    sys.path.insert(0, str(ROOT))

MARKER = "<!-- cli-reference -->"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(f"`{o}`" for o in action.option_strings)
    if action.nargs == 0:
        return names
    if action.choices:
        return f"{names} `{{{','.join(str(c) for c in action.choices)}}}`"
    metavar = action.metavar or action.dest.upper()
    return f"{names} `{metavar}`"


def _default(action: argparse.Action) -> str:
    if not action.option_strings or action.nargs == 0 or action.required:
        return "required" if action.required else ""
    if action.default in (None, argparse.SUPPRESS, [], ""):
        return ""
    return f"`{action.default}`"


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    params = dict(vars(action), prog=parser.prog)
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    try:
        return _cell(action.help % params)
    except (KeyError, TypeError, ValueError):
        return _cell(action.help)


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps no public list of subparsers
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name) or ""


def _section(name: str, sub: argparse.ArgumentParser, summary: str) -> list[str]:
    usage = sub.format_usage().strip().removeprefix("usage: ")
    lines = [f"## {name}", ""]
    description = sub.description or summary
    if description:
        lines += [_cell(description), ""]
    lines += ["```text", usage, "```", ""]
    for group in sub._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
        if not actions:
            continue
        title = group.title if group.title not in ("options", "optional arguments") else "options"
        lines += [f"**{_cell(title)}**", "", "| argument | default | meaning |", "|---|---|---|"]
        lines += [f"| {_flags(a)} | {_default(a)} | {_help(a, sub)} |" for a in actions]
        lines.append("")
    return lines


# Defaults that `--help` reads from the environment: the page shows what they are on a machine
# that sets none of them, with the home folder written as "~", never the build machine's own.
MACHINE_ENV = ("HF_HOME", "XDG_CACHE_HOME", "PYGGML_CODEC_CACHE", "HF_ENDPOINT")
PAGE_HOME = "/home/page-user"


def cli_markdown() -> str:
    """The CLI reference as Markdown: a summary table, then one section per command."""
    from pyggml_codec.cli.main import get_parser

    saved = {k: os.environ.get(k) for k in (*MACHINE_ENV, "HOME", "COLUMNS")}
    for k in MACHINE_ENV:
        os.environ.pop(k, None)
    # A home folder of its own, written as "~" below: replacing the machine's home text would
    # turn every "/" into "~" where home is "/". Usage lines wrapped at 100 columns.
    os.environ.update(HOME=PAGE_HOME, COLUMNS="100")
    try:
        parser = get_parser()
        commands = list(_subcommands(parser))
        lines = ["| command | what it does |", "|---|---|"]
        lines += [f"| [`{name}`](#{name}) | {_cell(summary)} |" for name, _, summary in commands]
        lines.append("")
        for name, sub, summary in commands:
            lines += _section(name, sub, summary)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return "\n".join(lines).replace(PAGE_HOME + "/", "~/")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs hook signature
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_markdown())
    return markdown


if __name__ == "__main__":
    print(cli_markdown())
