"""``ActorHost``'s public methods: the nodes as its node knows them, what it does now, and its end.

Every other module goes through these instead of the engine's ``Node`` the
host holds; each test sets what the method answers against the node itself.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from actors import Counter, Slow

from actorch._transport.base import NodeInfo
from actorch.testing import LocalWorld


async def wait_for(predicate: Any) -> None:
    """Let the loop run until ``predicate()`` holds (two seconds at most)."""
    async with asyncio.timeout(2.0):
        while not predicate():  # noqa: ASYNC110 - polls runtime state that has no event
            await asyncio.sleep(0.01)


async def test_host_knows_the_nodes_of_its_world(world: LocalWorld) -> None:
    host = world._hosts[1]
    assert host.world_size == 3
    assert [info.rank for info in host.peers()] == host.ranks() == [0, 1, 2]
    assert host.peer(2) == host.node.transport.peer(2)
    assert host.knows(2)
    assert not host.knows(7)
    assert host.lost == {}
    assert host.left == set()


async def test_host_counts_a_node_lost_and_tells_its_listeners(world: LocalWorld) -> None:
    host = world._hosts[0]
    heard: list[tuple[int, str]] = []
    host.on_peer_lost(lambda rank, why: heard.append((rank, why)))
    world.kill(2)
    await wait_for(lambda: heard)
    assert heard == [(2, host.lost[2])]
    assert world._hosts[2].closed  # cut off, as if its process had died


async def test_host_tells_its_listeners_when_a_node_joins(world: LocalWorld) -> None:
    host = world._hosts[0]
    joined: list[NodeInfo] = []
    host.on_peer_joined(joined.append)
    newcomer = host.peer(2)
    host.node._on_peer_joined(newcomer)  # as the transport announces one
    assert joined == [newcomer]


async def test_host_hands_its_parts_the_node_s_logger_loop_and_caller(world: LocalWorld) -> None:
    host = world._hosts[0]
    assert host.log is host.node.log
    assert host.loop is asyncio.get_running_loop()
    assert host.caller is host.node.caller


async def test_host_lists_the_calls_it_waits_for_and_the_actors_busy_with_them(world: LocalWorld) -> None:
    slow = await world[0].spawn(Slow, on=1)
    assert world._hosts[1].busy_actors() == []
    call = asyncio.ensure_future(slow.call(Slow.slow, "held", 30.0))
    await wait_for(world._hosts[1].busy_actors)
    [waiting] = world._hosts[0].calls_waiting()
    assert (waiting.endpoint, waiting.label) == ("slow", repr(slow)[len("<ActorRef ") : -1])
    assert [cell.actor_id for cell in world._hosts[1].busy_actors()] == [slow._actor_id]
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    await wait_for(lambda: not world._hosts[1].busy_actors())
    assert world._hosts[0].calls_waiting() == []


async def test_host_counts_what_its_node_sent(world: LocalWorld) -> None:
    counter = await world[0].spawn(Counter, on=1)
    before = world._hosts[0].statistics()
    await counter.call(Counter.add, 1)
    after = world._hosts[0].statistics()
    assert after.keys() == world._hosts[0].node.statistics().keys()
    assert after["calls_sent"] == before["calls_sent"] + 1


async def test_host_says_whether_it_records_a_timeline(world: LocalWorld, tmp_path: Path) -> None:
    host = world._hosts[2]
    assert not host.tracing
    async with world[0].trace(tmp_path / "run.json"):
        assert host.tracing
    assert not host.tracing


async def test_host_answers_off_its_loop_and_asks_other_nodes_so(world: LocalWorld) -> None:
    host = world._hosts[0]
    assert host.loop_behind() == 0.0  # the loop keeps up
    own = host.answer_off_loop("loop")
    assert (own["rank"], own["running"]) == (0, None)
    other = await asyncio.to_thread(host.ask_off_loop, 2, "stacks", 2.0)
    assert other["rank"] == 2
    assert "threads" in other


async def test_host_writes_to_its_run_record_only_when_it_keeps_one(world: LocalWorld) -> None:
    host = world._hosts[0]
    written: list[tuple[str, dict[str, Any]]] = []

    class Record:
        def write(self, event: str, **fields: Any) -> None:
            written.append((event, fields))

    assert host.node.record is None
    host.write_record("run started", script="x.py")  # nothing kept: nothing to write to
    host.node.record = Record()  # type: ignore[assignment]
    try:
        host.write_record("run ended", outcome="ok")
    finally:
        host.node.record = None
    assert written == [("run ended", {"outcome": "ok"})]


async def test_host_departs_then_closes(world: LocalWorld) -> None:
    host = world._hosts[2]
    assert not host.departing
    host.depart()
    assert host.departing
    assert host.node.departing
    assert not host.closed
    await host.close()
    assert host.closed
    assert host.node.closed
