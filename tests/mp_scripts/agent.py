"""A host agent starts node processes on its own host: ``python agent.py``, with a joined ``actorch serve --pool``.

Rank 0 starts an elastic system listening on ``AGENT_HOST:AGENT_PORT`` (the
join token comes from ``ACTORCH_JOIN_TOKEN``) and waits for the host agent the
test starts on the other host (``actorch serve --pool --name host-b``). Then it
has the agent add two nodes there, gives an actor a process of its own there,
places an actor on the added nodes by their label, and returns; every process
on both hosts must end with it. It prints one ``RESULT agent {json}``.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from actors import Simulator, emit

import actorch

AGENT = "host-b"


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    async with asyncio.timeout(120):
        nodes = await system.wait_nodes(2, timeout=90)
        agent = next(info for info in nodes if info.pool and info.rank != 0)
        added = await system.add_nodes(2, host=AGENT, label="b-env")
        own = await system.spawn(Simulator, name="b/own", on=actorch.Where(process="own", host=AGENT))
        placed = await system.spawn(Simulator, on=actorch.Where(label="b-env"))
        where = {"own": await own.call(Simulator.where), "placed": await placed.call(Simulator.where)}
        unknown = None
        try:
            await system.add_nodes(1, host="host-c")
        except actorch.UnsupportedError as exc:
            unknown = str(exc)
    emit(
        "agent",
        agent=[agent.rank, agent.label, agent.pool, agent.resources.get("b_slots")],
        added=[[info.rank, info.parent, info.label] for info in added],
        own_node=[(info.owner, info.parent) for info in system.nodes if info.rank == own.rank],
        where=where,
        here=os.readlink("/proc/self/ns/net"),
        unknown=unknown,
    )
    return {"main": "returned"}


if __name__ == "__main__":
    host, port = os.environ["AGENT_HOST"], int(os.environ["AGENT_PORT"])
    result = actorch.run(main, elastic=True, host=host, port=port, stop_grace=2.0)
    print("RETURNED " + json.dumps(result), flush=True)
