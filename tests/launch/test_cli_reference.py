"""The CLI reference page (``docs/cli.md``) is the one the argument parser makes: it cannot drift from the command."""

from __future__ import annotations

from _mp import REPO

from actorch._launch.cli.command import parser
from actorch._launch.cli.reference import reference


def test_the_cli_reference_page_is_made_from_the_parser() -> None:
    page = (REPO / "docs" / "cli.md").read_text()
    assert page == reference(), "docs/cli.md is stale: python -m actorch._launch.cli.reference > docs/cli.md"


def test_the_cli_reference_names_every_flag_of_every_command() -> None:
    page = reference()
    for command in ("run", "serve", "status", "stop"):
        assert f"## actorch {command}" in page
    for action in parser()._subparsers._group_actions[0].choices["run"]._actions:  # type: ignore[union-attr]
        for flag in action.option_strings:
            assert f"`{flag}`" in page or flag in ("-h", "--help")
