"""A fast lane that goes silent while torch RPC still answers: the peer is lost, and the call waiting on it fails.

Runs inside a network namespace of its own (the test makes it), as root: after
a few calls have gone on the lane, every packet to node 1's lane port is
dropped (``netns.silence_port``), while torch RPC's connections and heartbeats
go on as before. Usage: ``python silent_lane.py``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

# isort: off
import actorch
from actors import Counter, attempt, emit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import netns  # the tests' own helpers, one folder up

# isort: on


async def main(system: actorch.ActorSystem) -> None:
    counter = await system.spawn(Counter, args=(0,), name="silent/c", on=1)
    for _ in range(50):  # until the lane is up and carries the calls
        await counter.call(Counter.add, 1)
        if system.statistics()["lane_bundles_sent"] > 0:
            break
        await asyncio.sleep(0.02)
    lane = system.nodes[1].lane
    assert lane is not None
    netns.silence_port(int(lane.rpartition(":")[2]))
    silenced = time.monotonic()
    outcome = await attempt(counter.call(Counter.add, 1))
    emit(
        "silent_lane",
        outcome=outcome,
        seconds=time.monotonic() - silenced,
        lane_bundles=system.statistics()["lane_bundles_sent"],
        lost=system.lost_nodes,
    )


if __name__ == "__main__":
    actorch.run(main, world_size=2, liveness_timeout=2.5)
