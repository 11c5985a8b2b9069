"""Faults inside a running world: stuck handlers, a hanging ``on_stop``, a blocked event loop, rank 0 killed.

Usage: ``python faults.py MODE TMPDIR`` with ``stop_grace`` 1 s, three processes:

- ``stuck``: stopping an actor with a handler that never returns and an
  ``on_stop`` that hangs; then ``main`` returns with handlers still stuck
  (one that can be cancelled, one that swallows its cancellation);
- ``blocked``: a worker's handler blocks its event loop when ``main`` returns;
- ``slow_start``: rank 1's event loop is blocked for twice the liveness timeout
  the moment its torch RPC agent is up, before its transport's ``start``
  resumes (as when a handler rank 0 sent at once blocks it); ``main`` then
  calls an actor there;
- ``rank0``: ``main`` writes ``TMPDIR/ready`` (the workers' pids) and sleeps
  until the test kills this process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from actors import Stopper, attempt, emit
from faulty import HangingStop, Stuck

import actorch
from actorch._transport.torch_rpc.elastic import ElasticRpcTransport
from actorch._transport.torch_rpc.rpc import RpcTransport

MODE = sys.argv[1]
TMP = Path(sys.argv[2])
GRACE = 1.0
LIVENESS = 2.5  # run()'s default liveness_timeout
MAIN_RETURNED: list[float] = []


def block_rank_1_when_up() -> None:
    """Queue a loop-blocking sleep on rank 1 ahead of the news that its transport is up.

    A local launch runs on an elastic world (private to the processes it
    starts), a static one with device maps: both transports are wrapped.
    """

    def block() -> None:
        time.sleep(2 * LIVENESS)  # blocks rank 1's event loop: the fault under test
        (TMP / "unblocked").write_text("")

    def wrapped(init_rpc: Callable[[RpcTransport], None]) -> Callable[[RpcTransport], None]:
        def init_then_block(self: RpcTransport) -> None:
            init_rpc(self)
            if self.rank == 1:
                self._inbox_loop.call_soon_threadsafe(block)

        return init_then_block

    for kind in (RpcTransport, ElasticRpcTransport):
        kind._init_rpc = wrapped(kind._init_rpc)  # type: ignore[method-assign]


async def stuck(system: actorch.ActorSystem) -> None:
    hanging_stop = await system.spawn(HangingStop, args=(str(TMP / "on_stop_began"),), on=1)
    stuck = await system.spawn(Stuck, on=1)
    pending = asyncio.ensure_future(stuck.call(Stuck.forever))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    stopped = await attempt(hanging_stop.stop())
    stop_seconds = time.monotonic() - started
    stopper_alone = await system.spawn(Stuck, on=2)
    waiting = asyncio.ensure_future(stopper_alone.call(Stuck.forever))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await stopper_alone.stop()
    forever_stop_seconds = time.monotonic() - started
    emit(
        "stuck",
        stop=stopped,
        stop_seconds=stop_seconds,
        on_stop_began=(TMP / "on_stop_began").exists(),
        forever_stop_seconds=forever_stop_seconds,
        forever_outcome=await attempt(waiting),
    )
    stubborn = await system.spawn(Stuck, on=2)
    stubborn.tell(Stuck.stubborn)
    stuck.tell(Stuck.forever)
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank2"),), on=2)
    pending.cancel()
    await asyncio.sleep(0.2)


async def blocked(system: actorch.ActorSystem) -> None:
    stuck = await system.spawn(Stuck, on=1)
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank2"),), on=2)
    emit("blocked", pid=await stuck.call(Stuck.pid))
    stuck.tell(Stuck.block, 600.0)
    await asyncio.sleep(0.3)


async def slow_start(system: actorch.ActorSystem) -> None:
    started = time.monotonic()
    while not (TMP / "unblocked").exists() and time.monotonic() - started < 30:  # noqa: ASYNC110 - another process
        await asyncio.sleep(0.05)
    stuck = await attempt(system.spawn(Stuck, on=1))
    emit("slow_start", spawn=stuck, waited=time.monotonic() - started)


async def rank0(system: actorch.ActorSystem) -> None:
    for rank in (1, 2):
        await system.spawn(Stopper, args=(str(TMP / f"on_stop_rank{rank}"),), on=rank)
    pids = [node.pid for node in system.nodes[1:]]
    (TMP / "ready").write_text(json.dumps(pids))
    await asyncio.sleep(600)


async def main(system: actorch.ActorSystem) -> str:
    await {"stuck": stuck, "blocked": blocked, "slow_start": slow_start, "rank0": rank0}[MODE](system)
    MAIN_RETURNED.append(time.monotonic())
    return "main finished"


if MODE == "slow_start":
    block_rank_1_when_up()  # at import: spawned workers import this module too

if __name__ == "__main__":
    result = actorch.run(main, world_size=3, stop_grace=GRACE)
    emit("shutdown", seconds=time.monotonic() - MAIN_RETURNED[0], result=result)
