"""The CLI reference page, ``docs/cli.md``, made from the ``actorch`` command's own argument parser.

``python -m actorch._launch.cli.reference > docs/cli.md`` writes it again;
``tests/launch/test_cli_reference.py`` fails when the page and the parser differ, so
the page can only say what the command accepts.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from actorch._launch.cli.command import parser

__all__ = ["reference"]

_WIDTH = "100"
"""Columns the usage lines are wrapped at (argparse reads ``COLUMNS``)."""
_HEADER = """\
# Command-line reference

<!-- Made by `python -m actorch._launch.cli.reference > docs/cli.md` from the argument parser; do not edit. -->

Every flag of the `actorch` command (`python -m actorch` is the same command,
but imports the whole package, torch included, before it reads a flag; `actorch`
imports torch only for `run` and `serve`). What the commands do, with examples,
is in [operations](operations.md). Bad input is one line on stderr and exit
code 2; a failure is one line and exit code 1.
"""


def reference() -> str:
    """The whole page, as Markdown."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = _WIDTH
    try:
        top = parser()
        sections = [_HEADER, _usage(top)]
        for name, command in _commands(top).items():
            sections.append(f"## actorch {name}\n\n{_escape(command.description or '')}\n\n{_usage(command)}")
            sections.extend(_table(group) for group in command._action_groups if _shown(group))
        examples = textwrap.dedent((top.epilog or "").removeprefix("examples:\n")).strip()
        sections.append(f"## Examples\n\n```text\n{examples}\n```\n")
        return "\n".join(section.rstrip() + "\n" for section in sections)
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def _commands(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _usage(command: argparse.ArgumentParser) -> str:
    return f"```text\n{command.format_usage().strip()}\n```\n"


def _shown(group: argparse._ArgumentGroup) -> bool:
    return any(action.help != argparse.SUPPRESS and action.dest != "help" for action in group._group_actions)


def _table(group: argparse._ArgumentGroup) -> str:
    title = "arguments" if group.title == "positional arguments" else group.title or "options"
    rows = [f"**{_escape(title)}**\n", "| flag | value | what it does |", "|---|---|---|"]
    for action in group._group_actions:
        if action.help == argparse.SUPPRESS or action.dest == "help":
            continue
        flags = ", ".join(f"`{flag}`" for flag in action.option_strings) or f"`{action.dest}`"
        if action.nargs == 0:
            value = ""
        elif action.nargs == argparse.REMAINDER:
            value = "`...`"
        else:
            value = f"`{action.metavar or action.dest.upper()}`"
        rows.append(f"| {flags} | {value} | {_escape(action.help or '')} |")
    return "\n".join(rows) + "\n"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


if __name__ == "__main__":
    sys.stdout.write(reference())
