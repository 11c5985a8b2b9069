"""Failures nobody hears, logged on the worker that hosts the actor: a failed tell, an actor that failed.

Usage: ``python failure_logs.py``. An actor on node 1 fails a tell, then fails
for good (a fatal error, no restart policy); how the logs render depends on
whether stderr is a terminal.
"""

from __future__ import annotations

import contextlib

import actorch


class Fragile(actorch.Actor):
    fatal_errors = (KeyError,)

    async def fail(self) -> None:
        raise ValueError("told to fail")

    async def corrupt(self) -> None:
        raise KeyError("corrupt")

    async def ping(self) -> int:
        return 1


async def main(system: actorch.ActorSystem) -> None:
    ref = await system.spawn(Fragile, on=1)
    ref.tell(Fragile.fail)
    await ref.call(Fragile.ping)  # the tell was handled before
    with contextlib.suppress(KeyError):  # fatal: the actor fails with it
        await ref.call(Fragile.corrupt)
    await ref.wait_stopped()


if __name__ == "__main__":
    actorch.run(main, world_size=2)
