"""The long examples' progress bar (``examples/_progress.py``): a rich bar on a terminal, plain lines elsewhere.

The helper is checked in this process against rich consoles that are or are
not terminals; then ``examples/replay.py`` runs on one node (no worker
processes) once on a pseudo-terminal, where it draws the bar and still prints
its lines, and once into a pipe, where its output has no escape sequence.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
from types import ModuleType

import pytest
from _mp import _SCRUBBED, REPO, run_on_terminal
from rich.console import Console

EXAMPLES = REPO / "examples"
LONG_EXAMPLES = ["reinforce.py", "batch_timing.py", "parameter_server.py", "replay.py", "collect_train.py"]
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BAR = "━"  # rich's bar character
LINES = ["Episode 1\tLast reward: 20.00", "Episode 2\tLast reward: 30.00", "Episode 3\tLast reward: 40.00"]
DONE = re.compile(r"done in .*?([\d,]+) transitions in .*?([\d,]+) samples/s out")


def load_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_progress", EXAMPLES / "_progress.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ProgressBar = load_helper().ProgressBar


def play(bar: object) -> None:
    """What an example does: print its lines, advance the bar."""
    with bar as entered:
        entered.update(description="CartPole")
        for line in LINES:
            print(line)
            entered.advance()


def terminal(**options: object) -> tuple[Console, io.StringIO]:
    screen = io.StringIO()
    return Console(file=screen, force_terminal=True, width=100, soft_wrap=True, **options), screen


def test_where_stdout_is_no_terminal_the_example_prints_its_lines_and_nothing_else(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich would call a pipe a terminal; the helper asks isatty
    monkeypatch.setenv("TERM", "xterm-256color")
    bar = ProgressBar(len(LINES), "episodes")
    assert not bar.shown
    play(bar)
    out = capsys.readouterr().out
    assert out == "".join(f"{line}\n" for line in LINES)


def test_no_progress_or_a_dumb_terminal_leaves_the_lines_plain(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    console, screen = terminal()
    play(ProgressBar(len(LINES), "episodes", enabled=False, console=console))
    monkeypatch.setenv("TERM", "dumb")
    dumb, dumb_screen = terminal()
    play(ProgressBar(len(LINES), "episodes", console=dumb))
    assert screen.getvalue() == dumb_screen.getvalue() == ""
    assert capsys.readouterr().out == "".join(f"{line}\n" for line in LINES) * 2


def test_on_a_terminal_a_bar_counts_the_units_and_the_lines_print_above_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    console, screen = terminal()
    bar = ProgressBar(len(LINES), "episodes", console=console)
    assert bar.shown
    play(bar)
    drawn = screen.getvalue()
    assert BAR in drawn
    assert "\x1b[" in drawn
    plain = ESCAPE.sub("", drawn)
    assert "CartPole" in plain
    assert f"{len(LINES)}/{len(LINES)} episodes" in plain
    for line in LINES:
        assert line.expandtabs() in plain
    assert capsys.readouterr().out == "", "while the bar is live, print goes to rich's console"


def test_no_color_keeps_the_bar_without_colours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    console, screen = terminal()
    play(ProgressBar(len(LINES), "episodes", console=console))
    drawn = screen.getvalue()
    assert BAR in drawn
    assert not re.search(r"\x1b\[[0-9;]*m", drawn.replace("\x1b[0m", "")), "no colour codes"


@pytest.mark.parametrize("name", LONG_EXAMPLES)
def test_the_long_examples_use_the_bar_and_take_no_progress(name: str) -> None:
    source = (EXAMPLES / name).read_text()
    assert "from _progress import ProgressBar" in source
    assert "ProgressBar(" in source
    assert '"--progress", action=argparse.BooleanOptionalAction' in source


def replay(*args: str, on_terminal: bool, timeout: float = 45.0) -> str:
    """Run ``examples/replay.py`` on one node, its stdout and stderr a pseudo-terminal or a pipe."""
    env = {key: value for key, value in os.environ.items() if key not in _SCRUBBED}
    env.pop("NO_COLOR", None)
    env["TERM"] = "xterm-256color"
    argv = [sys.executable, str(EXAMPLES / "replay.py"), "--world-size", "1", *args]
    if not on_terminal:
        finished = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        assert finished.returncode == 0, finished.stdout + finished.stderr
        return finished.stdout
    code, out = run_on_terminal(
        argv, timeout, env={"NO_COLOR": None, "TERM": "xterm-256color"}, size=(40, 160), colour=True
    )
    assert code == 0, out
    return out


@pytest.mark.timeout(90)
def test_replay_example_draws_a_bar_on_a_terminal_and_plain_lines_into_a_pipe() -> None:
    drawn = replay("--seconds", "2", on_terminal=True)
    assert BAR in drawn
    assert "\x1b[" in drawn
    plain = ESCAPE.sub("", drawn)
    assert "learning" in plain
    assert "/2 s" in plain
    lines = re.split(r"[\r\n]", plain)
    assert any(line.startswith("1 observers on nodes [0]") for line in lines), drawn
    assert any(re.match(r"\s+t=\s*[\d.]+s\s+in\s+[\d,]+ transitions/s", line) for line in lines), drawn
    assert DONE.search(plain), drawn

    piped = replay("--seconds", "0.5", on_terminal=False)
    assert "\x1b" not in piped
    assert BAR not in piped
    assert "\r" not in piped
    assert piped.startswith("1 observers on nodes [0]")
    assert DONE.search(piped), piped
