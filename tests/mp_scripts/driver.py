"""Drivers besides ``run``'s ``main``: ``actorch.start`` from ``asyncio.run``, ``connect``, ``serve(setup)``.

Usage: ``python driver.py MODE TMPDIR``, where MODE is:

- ``joiners``: rank 0 of an elastic system (``actorch.run``) starts two
  processes with the system's address and token in their environment: one
  ``connect``s and drives (``driver.py connected TMPDIR``), one ``serve``s with
  a ``setup`` that takes the system (``driver.py served TMPDIR``). Rank 0 calls
  what each of them spawned on its own node, then waits for both to leave.
- ``forgot``: ``asyncio.run`` of a program that starts a two-process system
  and returns without shutting it down.
- ``killed``: starts a two-process system, writes ``TMPDIR/ready`` with the
  worker's pid, and waits; the test kills this process.
- ``exits``: starts a two-process system in a loop it never closes, and
  exits (``sys.exit``) with the system up.

Each check prints one ``RESULT {json}``; a joiner's output goes to
``TMPDIR/<mode>.out``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from actors import Stopper, emit
from elastic_actors import Worker

import actorch

MODE = sys.argv[1]
TMP = Path(sys.argv[2])
HERE = Path(__file__).resolve().parent


async def joiners(system: actorch.ActorSystem) -> dict[str, Any]:
    await system.spawn(Worker, name="main/worker", on=1)
    events: list[str] = []

    async def collect() -> None:
        async for event in system.events():
            if isinstance(event, actorch.NodeJoined | actorch.NodeLeft | actorch.NodeLost):
                events.append(f"{type(event).__name__} {event.rank}")

    collecting = asyncio.ensure_future(collect())
    procs = {mode: start_joiner(system, mode) for mode in ("connected", "served")}

    driven = await system.lookup("driver/here")  # spawned by the connected driver, on its own node
    driven_where = await driven.call(Worker.where)
    await driven.call(Worker.note, "from rank 0")  # the driver leaves once it has been called
    served = await system.lookup("served/here")  # spawned by serve()'s setup, on its own node
    served_where = await served.call(Worker.where)
    await system.leave(served_where[0])

    codes = {mode: await asyncio.to_thread(proc.wait, 30) for mode, proc in procs.items()}
    names = sorted(ref.name for ref in await system.lookup_all("**"))
    collecting.cancel()
    return {
        "codes": codes,
        "driven_where": driven_where,
        "served_where": served_where,
        "pids": {mode: proc.pid for mode, proc in procs.items()},
        "names": names,
        "events": events,
        "nodes": [info.rank for info in system.nodes],
        "driver": result_in(TMP / "connected.out", "connected"),
        "stopped": sorted(path.name for path in TMP.glob("stopped-*")),  # noqa: ASYNC240 - a few names, once
    }


def start_joiner(system: actorch.ActorSystem, mode: str) -> subprocess.Popen[bytes]:
    with (TMP / f"{mode}.out").open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(HERE / "driver.py"), mode, str(TMP)],
            env={**os.environ, **system.join_env()},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def result_in(path: Path, check: str) -> dict[str, Any] | str:
    """The ``RESULT`` a joiner printed for ``check``, or its whole output if it printed none."""
    text = path.read_text(errors="replace")
    for line in text.splitlines():
        if line.startswith("RESULT "):
            record: dict[str, Any] = json.loads(line[len("RESULT ") :])
            if record["check"] == check:
                return record
    return text


async def connected() -> None:
    async with actorch.connect(name="driver", join_timeout=30) as system:
        here = await system.spawn(Worker, args=(str(TMP),), name="driver/here")
        there = await system.spawn(Worker, name="driver/there", on=1)
        found = await system.lookup("main/worker")
        told = TMP / "told"
        while not told.exists():  # noqa: ASYNC110 - rank 0 calls driver/here (it writes the file) once it found it
            await asyncio.sleep(0.05)
        emit(
            "connected",
            rank=system.rank,
            pid=os.getpid(),
            here=await here.call(Worker.where),
            there=await there.call(Worker.where),
            found=await found.call(Worker.where),
            labels=[info.label for info in system.nodes],
        )
    # What it spawned on node 1 outlives it; its own node has left.
    emit("left", shutdown_again=repr(await system.shutdown()))


async def served_setup(system: actorch.ActorSystem) -> None:
    await system.spawn(Worker, args=(str(TMP),), name="served/here")


async def forgot() -> None:
    system = await actorch.start(world_size=2, stop_grace=0.5)
    worker = await system.spawn(Stopper, args=(str(TMP / "on_stop_rank1"),), on=1)
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank0"),), on=0)
    emit("forgot", where=await worker.call(Stopper.where))


async def killed() -> None:
    system = await actorch.start(world_size=2, stop_grace=0.5)
    worker = await system.spawn(Stopper, args=(str(TMP / "on_stop_rank1"),), on=1)
    _, pid = await worker.call(Stopper.where)
    (TMP / "ready").write_text(str(pid))
    await asyncio.Event().wait()


def exits() -> None:
    loop = asyncio.new_event_loop()
    system = loop.run_until_complete(actorch.start(world_size=2, stop_grace=20.0))
    worker = loop.run_until_complete(system.spawn(Stopper, args=(str(TMP / "on_stop_rank1"),), on=1))
    emit("exits", where=loop.run_until_complete(worker.call(Stopper.where)))
    sys.exit(0)  # no shutdown, no clean-up of the loop: only the exit hook is left


if __name__ == "__main__":
    if MODE == "joiners":
        emit("joiners", **actorch.run(joiners, world_size=2, elastic=True, stop_grace=1.0))
    elif MODE == "connected":
        asyncio.run(connected())
    elif MODE == "served":
        sys.exit(actorch.serve(name="served", setup=served_setup, join_timeout=30))
    elif MODE == "forgot":
        asyncio.run(forgot())
    elif MODE == "killed":
        asyncio.run(killed())
    elif MODE == "exits":
        exits()
