"""Hangs diagnosed from outside, on a live three-node system stuck three ways (``mp_scripts/hangs.py``).

One system serves every test of the module: a handler blocking node 1's loop in
``time.sleep``, one awaiting an event nobody sets (a call queued behind it), and
two actors waiting on each other across nodes. ``actorch status`` and
``actorch stacks`` must say so, from another process, as a user would run them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _mp import REPO, SCRIPTS, Script, script_argv, script_env, wait_for_file

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

SCRIPT = SCRIPTS / "hangs.py"
CYCLE = {"hang/a", "hang/b"}


def _line_of(marker: str) -> int:
    """The line of ``hangs.py`` that carries ``marker``."""
    (line,) = [number for number, text in enumerate(SCRIPT.read_text().splitlines(), 1) if marker in text]
    return line


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "_actorch_cli", *args],
        cwd=REPO,
        env=script_env("cli"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def stuck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stuck system's status address, once all three hangs are in place (and then some)."""
    tmp = tmp_path_factory.mktemp("hangs")
    system = Script(script_argv("hangs.py", str(tmp)))
    try:
        wait_for_file(tmp / "ready", system, 90)
        address = json.loads((tmp / "ready").read_text())["address"]
        yield address
    except BaseException:
        system.kill()
        raise
    (tmp / "done").write_text("done")
    finished = system.finish(60)
    finished.assert_clean_exit()
    assert finished.returned() == "diagnosed"


def _status_when(address: str, ready: Any) -> dict[str, Any]:
    """The status once ``ready(status)`` holds (the hangs take a moment to form); the last one read else."""
    deadline = time.monotonic() + 30
    while True:
        done = _cli("status", "--json", "--address", address)
        assert done.returncode == 0, done.stderr
        status: dict[str, Any] = json.loads(done.stdout)
        if ready(status) or time.monotonic() > deadline:
            return status
        time.sleep(0.3)


def _actors(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {actor["name"]: actor for node in status["nodes"] for actor in node.get("actors", ())}


def test_status_names_the_wait_cycle_across_nodes(stuck: str) -> None:
    status = _status_when(stuck, lambda status: status.get("wait_cycles"))
    assert status["schema"] == 5
    assert [set(cycle) for cycle in status["wait_cycles"]] == [CYCLE]
    actors = _actors(status)
    assert actors["hang/a"]["handlers"][0]["waits_on"] == ["hang/b"]
    assert actors["hang/b"]["handlers"][0]["waits_on"] == ["hang/a"]
    table = _cli("status", "--address", stuck)
    assert table.returncode == 0, table.stderr
    assert "waiting in a cycle" in table.stdout
    assert "hang/a -> hang/b -> hang/a" in table.stdout or "hang/b -> hang/a -> hang/b" in table.stdout


def test_status_shows_running_handlers_queued_age_and_loop_lag(stuck: str) -> None:
    status = _status_when(
        stuck,
        lambda status: "loop" in status["nodes"][1] and not status["nodes"][1]["loop"]["responsive"],
    )
    blocked = status["nodes"][1]
    assert "unanswered" in blocked  # its loop cannot give its status...
    assert blocked["loop"]["behind"] > 1.0  # ...but a thread of it says the loop is blocked
    for rank in (0, 2):
        assert status["nodes"][rank]["loop"]["responsive"]
        assert status["nodes"][rank]["loop"]["lag"] >= 0
    waiter = _actors(status)["hang/waiter"]
    (running,) = waiter["handlers"]
    assert running["endpoint"] == "wait"
    assert running["seconds"] > 0
    assert waiter["queued"] == 1
    assert waiter["queued_seconds"] > 0
    table = _cli("status", "--address", stuck).stdout
    assert "BLOCKED" in table
    assert "wait (" in table  # the waiter's running handler and its age


def test_stacks_find_a_blocked_loop_and_an_awaiting_handler_at_their_lines(stuck: str) -> None:
    _status_when(stuck, lambda status: not status["nodes"][1].get("loop", {"responsive": True})["responsive"])
    done = _cli("stacks", "--address", stuck)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    sleeping = f'File "{SCRIPT}", line {_line_of("STUCK: sleeping")}, in nap'
    awaiting = f'File "{SCRIPT}", line {_line_of("STUCK: awaiting")}, in wait'
    node1 = text[text.index("\nnode 1 (") : text.index("\nnode 2 (")]
    assert "event loop BLOCKED" in node1
    sleeper = node1[node1.index("actor hang/sleeper") :]
    assert "handler 'nap', running for" in sleeper
    assert "on the loop thread now" in sleeper
    assert sleeping in sleeper.split("  threads")[0]
    node2 = text[text.index("\nnode 2 (") :]
    waiter = node2[node2.index("actor hang/waiter") : node2.index("actor hang/a (Peer)")]
    assert awaiting in waiter
    assert "1 queued" in waiter
    assert "awaiting <Future pending" in waiter
    peer_a = node2[node2.index("actor hang/a (Peer)") :]
    assert "awaiting <RemoteCall 'answer' of actor 'hang/b' (Peer) on node 0 sent>" in peer_a
    # by default the user's frames only: none of actorch's, asyncio's or torch's, no thread or task without any
    assert f'File "{REPO / "actorch"}' not in text
    assert f'File "{os.path.dirname(asyncio.__file__)}' not in text
    assert "thread MainThread" not in text  # every node's loop runs there: its handlers show where it is
    assert "thread actorch-" not in text
    assert "task " not in node1
    assert text.rstrip().endswith("actorch stacks --all shows them)")

    everything = _cli("stacks", "--all", "--address", stuck)
    assert everything.returncode == 0, everything.stderr
    full = everything.stdout
    assert sleeping in full
    assert "thread MainThread" in full[full.index("\nnode 1 (") : full.index("\nnode 2 (")]
    assert f'File "{REPO / "actorch"}' in full
    assert len(full.splitlines()) > 3 * len(text.splitlines())

    as_json = _cli("stacks", "--json", "--address", stuck)
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    raw = json.loads(as_json.stdout)
    (sleeper_json,) = [actor for actor in raw["nodes"][1]["actors"] if actor["name"] == "hang/sleeper"]
    chain = sleeper_json["handlers"][0]["chain"]
    assert (chain[-1]["file"], chain[-1]["line"], chain[-1]["function"]) == (
        str(SCRIPT),
        _line_of("STUCK: sleeping"),
        "nap",
    )
    assert sleeper_json["handlers"][0]["running_now"]
