"""Who waits on whom, where handlers are, how the loop keeps up: in one process (in-process worlds).

The same on a live multi-process system, through the command line, is in
``test_hangs_multiprocess``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

import actorch
from actorch._engine.looplag import LoopLag
from actorch._engine.stacks import is_user_file
from actorch._engine.waits import WaitGraph, describe_cycle
from actorch._launch.cli.stacks import LEFT_OUT, format_stacks
from actorch._launch.cli.tables import status_tables
from actorch._launch.services.prometheus import metrics_text
from actorch._launch.services.status import StatusServer, gather_stacks, gather_status
from actorch.testing import LocalWorld

THIS = str(Path(__file__).resolve())


class Peer(actorch.Actor):
    """Two of them, made to wait on each other: ``hold`` calls the other once its ``ask`` has started."""

    def __init__(self) -> None:
        self.other: Any = None
        self.never = asyncio.Event()

    async def meet(self, other: Any) -> None:
        self.other = other

    async def hold(self) -> None:
        await asyncio.sleep(0.1)  # the other one's ask starts meanwhile: its call waits behind this one
        await self.other.call(Peer.answer)

    async def ask(self, seconds: float) -> None:
        async with asyncio.timeout(seconds):
            await self.other.call(Peer.answer)

    async def answer(self) -> str:
        return "answered"

    async def wait(self) -> None:
        await self.never.wait()  # <- awaits


def _line_of(marker: str) -> int:
    (line,) = [number for number, text in enumerate(Path(THIS).read_text().splitlines(), 1) if marker in text]
    return line


AWAITS = _line_of("# <-" + " awaits")
BLOCKS = _line_of("# <-" + " blocks")


# ---------------------------------------------------------------------- the graph


def _graph(*actors: tuple[str, list[tuple[int, int | None]], list[int]]) -> WaitGraph:
    """A graph of actors given as (name, [(key, caller key)...] running, [caller keys] queued)."""
    return WaitGraph.of(
        {
            "label": name,
            "handlers": [{"key": key, "caller": caller} for key, caller in running],
            "queued_callers": queued,
        }
        for name, running, queued in actors
    )


def test_wait_graph_names_a_cycle_of_handlers_waiting_on_each_others_mailboxes() -> None:
    # a runs 1 (its call to b waits in b's queue); b runs 2 (its call to a waits in a's queue)
    graph = _graph(("a", [(1, None)], [2]), ("b", [(2, None)], [1]))
    assert graph.cycles() == [["a", "b"]]
    assert graph.cycle_through(2) == ["b", "a"]
    assert graph.waits_on(1) == ["b"]
    assert describe_cycle(["a", "b"]) == "a -> b -> a"


def test_wait_graph_sees_no_cycle_in_a_reentrant_chain_or_a_plain_wait() -> None:
    # a runs 1 and, re-entrant, 3 for b's handler 2, which 1 called: it goes on, no deadlock
    graph = _graph(("a", [(1, None), (3, 2)], []), ("b", [(2, 1)], []))
    assert graph.cycles() == []
    assert graph.cycle_through(1) is None
    assert graph.waits_on(1) == ["b"]
    assert graph.cycle_through(99) is None  # not a running handler
    assert _graph(("a", [(1, None)], [5]), ("c", [(5, None)], [])).cycles() == []


def test_wait_graph_lists_a_three_actor_cycle_once() -> None:
    graph = _graph(("a", [(1, None)], [3]), ("b", [(2, None)], [1]), ("c", [(3, None)], [2]))
    assert graph.cycles() == [["a", "b", "c"]]


# ---------------------------------------------------------------------- a live in-process world


async def test_a_deadline_in_a_same_node_wait_cycle_names_the_cycle(world: LocalWorld) -> None:
    a = await world[0].spawn(Peer, name="waits/a", on=1)
    b = await world[0].spawn(Peer, name="waits/b", on=1)
    await a.call(Peer.meet, b)
    await b.call(Peer.meet, a)
    holding = asyncio.ensure_future(b.call(Peer.hold))
    await asyncio.sleep(0.02)
    with pytest.raises(actorch.RemoteError, match=r"waiting in a cycle: waits/a -> waits/b -> waits/a") as caught:
        await a.call(Peer.ask, 0.5)
    assert isinstance(caught.value, TimeoutError)
    assert await holding is None  # once a gave up, b's call to it went through


async def test_a_deadline_without_a_cycle_is_a_plain_timeout(world: LocalWorld) -> None:
    asker = await world[0].spawn(Peer, on=1)
    waiter = await world[0].spawn(Peer, on=1)  # busy for ever, but waiting on nobody
    await asker.call(Peer.meet, waiter)
    waiting = asyncio.ensure_future(waiter.call(Peer.wait))
    try:
        await asyncio.sleep(0.05)
        with pytest.raises(actorch.RemoteError) as caught:
            await asker.call(Peer.ask, 0.2)  # its call to the waiter waits in the queue, then times out
        assert isinstance(caught.value, TimeoutError)
        assert "cycle" not in str(caught.value)
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


async def test_status_shows_running_handlers_queued_age_waits_and_loop_lag(world: LocalWorld) -> None:
    a = await world[0].spawn(Peer, name="status/a", on=1)
    b = await world[0].spawn(Peer, name="status/b", on=2)
    await a.call(Peer.meet, b)
    await b.call(Peer.meet, a)
    holding = asyncio.ensure_future(b.call(Peer.hold))
    await asyncio.sleep(0.02)
    asking = asyncio.ensure_future(a.call(Peer.ask, 30.0))
    waiting = [asyncio.ensure_future(a.call(Peer.wait)) for _ in range(2)]  # queued behind ask, for ever
    await asyncio.sleep(0.6)  # the cycle forms, and every node's loop probe fires
    status = await gather_status(world._hosts[0])
    assert status["schema"] == 5
    assert [set(cycle) for cycle in status["wait_cycles"]] == [{"status/a", "status/b"}]
    actors = {actor["name"]: actor for node in status["nodes"] for actor in node["actors"]}
    (ask,) = actors["status/a"]["handlers"]
    assert ask["endpoint"] == "ask"
    assert ask["seconds"] > 0
    assert ask["waits_on"] == ["status/b"]
    assert actors["status/a"]["queued"] == 3  # b's answer and the two waits
    assert actors["status/a"]["queued_seconds"] > 0
    assert actors["status/b"]["handlers"][0]["waits_on"] == ["status/a"]
    for node in status["nodes"]:
        assert node["loop"]["responsive"]
        assert node["loop"]["lag"] >= 0
    json.dumps(status)
    tables = status_tables(status, None)
    assert len(tables) == 3  # nodes, actors, and the cycle
    metrics = metrics_text(status).decode()
    assert 'actorch_event_loop_lag_seconds{node="1"}' in metrics
    assert 'actorch_mailbox_oldest_wait_seconds{actor="status/a",actor_class="Peer",node="1"}' in metrics
    for call in (holding, asking, *waiting):
        call.cancel()
    await asyncio.gather(holding, asking, *waiting, return_exceptions=True)


async def test_stacks_show_an_awaiting_handler_at_its_line_and_what_it_waits_for(world: LocalWorld) -> None:
    waiter = await world[0].spawn(Peer, name="stacks/waiter", on=2)
    waiting = [asyncio.ensure_future(waiter.call(Peer.wait)) for _ in range(2)]
    try:
        await asyncio.sleep(0.05)
        found = await asyncio.to_thread(gather_stacks, world._hosts[0])
        assert [node["rank"] for node in found["nodes"]] == [0, 1, 2]
        (actor,) = [actor for actor in found["nodes"][2]["actors"] if actor["name"] == "stacks/waiter"]
        assert actor["queued"] == 1
        (handler,) = actor["handlers"]
        assert handler["endpoint"] == "wait"
        assert not handler["running_now"]
        frames = [frame for frame in handler["chain"] if "file" in frame]
        assert (frames[-2]["file"], frames[-2]["line"], frames[-2]["function"]) == (THIS, AWAITS, "wait")
        assert handler["chain"][-1]["awaiting"].startswith("<Future pending")
        assert found["nodes"][0]["threads"][0]["name"] == "MainThread"
        text = format_stacks(found)
        assert f'File "{THIS}", line {AWAITS}, in wait' in text
        assert "actor stacks/waiter (Peer), 1 queued" in text
        assert "cell.py" not in text  # the user's frames only, by default: actorch's are left out
        assert "thread MainThread" not in text  # the loop's thread: its handlers show where it is
        assert text.rstrip().endswith(LEFT_OUT)
        everything = format_stacks(found, everything=True)
        assert f'File "{THIS}", line {AWAITS}, in wait' in everything
        assert "cell.py" in everything
        assert "thread MainThread" in everything
        assert LEFT_OUT not in everything
        assert "thread MainThread" not in format_stacks(found, threads=False, everything=True)
        assert "other tasks" not in format_stacks(found, tasks=False, everything=True)
    finally:
        for call in waiting:
            call.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


class Blocker(actorch.Actor):
    async def block(self, until: threading.Event) -> None:
        until.wait(30)  # <- blocks


async def test_the_status_server_answers_stacks_while_the_loop_is_blocked(world: LocalWorld) -> None:
    blocker = await world[0].spawn(Blocker, name="stacks/blocker", on=0)
    server = StatusServer(world._hosts[0], "127.0.0.1", 0)
    await server.start()
    answered: list[dict[str, Any]] = []
    done = threading.Event()

    def ask() -> None:
        time.sleep(0.2)  # the loop is blocked by then
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/stacks", timeout=20) as answer:
            answered.append(json.loads(answer.read()))
        done.set()

    asking = threading.Thread(target=ask)
    asking.start()
    try:
        await blocker.call(Blocker.block, done)  # same node: it runs in this task, and blocks the loop
    finally:
        asking.join(20)
        await server.close()
    (found,) = answered
    (actor,) = [actor for actor in found["nodes"][0]["actors"] if actor["name"] == "stacks/blocker"]
    (handler,) = actor["handlers"]
    assert handler["running_now"]
    chain = handler["chain"]
    assert [(frame["file"], frame["line"]) for frame in chain if frame["function"] == "block"] == [(THIS, BLOCKS)]
    assert chain[-1]["function"] == "wait"  # inside threading.Event.wait, on the loop's thread


async def test_loop_lag_counts_a_blocked_loop_as_behind() -> None:
    lag = LoopLag(asyncio.get_running_loop())
    assert lag.behind() == 0.0  # not started
    lag.start()
    try:
        await asyncio.sleep(0.6)
        assert lag.probes >= 1
        time.sleep(1.6)  # noqa: ASYNC251 - blocking the loop is the point
        state = lag.snapshot()
        assert not state["responsive"]
        assert state["behind"] > 1.0
        probes = lag.probes
        while lag.probes == probes:  # noqa: ASYNC110 - the probe's own count, polled
            await asyncio.sleep(0.1)
        assert lag.snapshot()["lag_max"] > 1.0  # the probe that fired late said so
    finally:
        lag.stop()


def test_is_user_file_tells_the_users_code_from_actorchs_pythons_and_installed_packages() -> None:
    assert is_user_file(__file__)
    assert is_user_file("/home/me/train.py")
    assert not is_user_file(actorch.__file__)
    assert not is_user_file(asyncio.__file__)
    assert not is_user_file(torch.__file__)
    assert not is_user_file("/opt/env/lib/python3.11/site-packages/gymnasium/core.py")
    assert not is_user_file("<frozen runpy>")
