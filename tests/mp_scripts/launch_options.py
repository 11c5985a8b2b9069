"""run()'s options for long work: long handlers, the RPC timeout, the per-node set-up, replies as they are ready.

Usage:
    python launch_options.py long SECONDS [RPC_TIMEOUT]   a handler computing SECONDS without awaiting
    python launch_options.py setup                        set-up on every node, then read back from actors
    python launch_options.py setup-fails                  set-up raising on rank 1: the system does not start
    python launch_options.py replies                      three slow calls sent at once: when each reply arrives,
                                                          with the fast lane and without
    python launch_options.py log-level                    a handler failing on each node, in a run at debug level,
                                                          then in one at error level (stderr marks each), then
                                                          a run at a level that is none
    python launch_options.py shared                       long 6 2, replies, then setup-fails, as worlds of one
                                                          process (their tests pay for one rank 0), returning
                                                          {"long": ..., "replies": ..., "setup-fails": ...}
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import sys
import time
from typing import Any

# isort: off
import actorch
import torch
from actors import describe

# isort: on


class Busy(actorch.Actor):
    """Computes without awaiting (a long forward pass, an epoch), and says what its node was set up with."""

    async def compute(self, seconds: float) -> str:
        time.sleep(seconds)  # noqa: ASYNC251 - blocks the loop, as a long synchronous computation does
        return "done"

    async def timed(self, seconds: float) -> list[float]:
        started = time.monotonic()
        time.sleep(seconds)  # noqa: ASYNC251 - the work of one micro-batch, without awaiting
        return [started, time.monotonic()]

    async def lane_bundles(self) -> int:
        """Bundles this node sent on the fast lane."""
        return int(self.system.statistics()["lane_bundles_sent"])

    async def prepared(self) -> dict[str, Any]:
        return {
            "rank": self.ref.rank,
            "marker": os.environ.get("ACTORCH_TEST_SETUP"),
            "draw": torch.rand(1).item(),
            "frozen": gc.get_freeze_count(),
            "young": gc.get_threshold()[0],
            "old": gc.get_threshold()[2],
        }


class Brittle(actorch.Actor):
    async def fail(self) -> None:
        raise ValueError("brittle")


async def fail_on_every_node(system: actorch.ActorSystem) -> int:
    """Have a handler fail on every node: each node logs it at debug level ("handler failed")."""
    for rank in range(system.world_size):
        brittle = await system.spawn(Brittle, on=rank)
        with contextlib.suppress(ValueError):
            await brittle.call(Brittle.fail)
    return system.world_size


def setup(rank: int) -> None:
    os.environ["ACTORCH_TEST_SETUP"] = f"set up on {rank}"
    torch.manual_seed(1000 + rank)


async def async_setup(rank: int) -> None:
    await asyncio.sleep(0)
    setup(rank)


def failing_setup(rank: int) -> None:
    if rank == 1:
        raise RuntimeError("this node cannot be set up")


SHARED_LONG = 6.0
"""Seconds the handler of ``long`` computes in ``shared`` mode, past its RPC timeout of ``SHARED_RPC_TIMEOUT``."""
SHARED_RPC_TIMEOUT = 2.0


async def long(system: actorch.ActorSystem) -> dict[str, Any]:
    busy = await system.spawn(Busy, on=1)
    started = time.monotonic()
    result = await busy.call(Busy.compute, float(sys.argv[2]) if sys.argv[1] == "long" else SHARED_LONG)
    return {"result": result, "seconds": time.monotonic() - started, "lost": sorted(system.lost_nodes)}


async def prepared(system: actorch.ActorSystem) -> dict[str, Any]:
    refs = [await system.spawn(Busy, on=rank) for rank in range(system.world_size)]
    return {"nodes": [await ref.call(Busy.prepared) for ref in refs]}


async def replies(system: actorch.ActorSystem) -> dict[str, Any]:
    busy = await system.spawn(Busy, on=1)
    arrived: list[float] = []

    async def one() -> list[float]:
        span = await busy.call(Busy.timed, 0.3)
        arrived.append(time.monotonic())
        return span

    spans = await asyncio.gather(one(), one(), one())  # sent together, in one bundle
    lanes = [system.statistics()["lane_bundles_sent"], await busy.call(Busy.lane_bundles)]
    return {"spans": spans, "arrived": arrived, "lane_bundles": lanes}


def setup_fails() -> dict[str, Any]:
    try:
        actorch.run(prepared, world_size=2, setup=failing_setup)
    except Exception as exc:
        return {"failed": describe(exc)}
    return {"failed": None}


def replies_both_ways() -> dict[str, Any]:
    return {
        "lane": actorch.run(replies, world_size=2),
        "rpc": actorch.run(replies, world_size=2, transport=actorch.TorchRpc(lane=False)),
    }


def main() -> None:
    mode = sys.argv[1]
    if mode == "long":
        timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
        value = actorch.run(long, world_size=2, transport=actorch.TorchRpc(timeout=timeout))
    elif mode == "shared":
        value = {
            "long": actorch.run(long, world_size=2, transport=actorch.TorchRpc(timeout=SHARED_RPC_TIMEOUT)),
            "replies": replies_both_ways(),
            "setup-fails": setup_fails(),  # last: nothing runs after a system that failed to start
        }
    elif mode == "setup":
        value = {
            "sync": actorch.run(prepared, world_size=3, setup=setup),
            "async": actorch.run(prepared, world_size=2, setup=async_setup, tune_gc=False),
        }
    elif mode == "setup-fails":
        value = setup_fails()
    elif mode == "log-level":
        value = {}
        for level in ("debug", "error"):
            print(f"RUN AT {level}", file=sys.stderr, flush=True)
            value[level] = actorch.run(fail_on_every_node, world_size=2, log_level=level)
        try:
            actorch.run(fail_on_every_node, world_size=2, log_level="loud")
        except ValueError as exc:
            value["loud"] = str(exc)
    else:
        value = replies_both_ways()
    print("RETURNED " + json.dumps(value), flush=True)


if __name__ == "__main__":
    main()
