"""A first actorch program: one Counter actor, called from rank 0.

Run it with ``python examples/quickstart.py``: the script's process becomes
rank 0 and runs ``main``; ranks 1 and 2 are local worker processes that host
actors. Under ``torchrun --nproc-per-node 3 examples/quickstart.py`` the same
script joins torchrun's world instead.
"""

from __future__ import annotations

import asyncio

import actorch


class Counter(actorch.Actor):
    """Counts; refuses to count backwards."""

    def __init__(self, start: int = 0) -> None:  # runs on the hosting node
        self.value = start

    async def on_start(self) -> None:
        print(f"  [{self.name} on node {self.system.rank}] started at {self.value}")

    async def on_stop(self) -> None:
        print(f"  [{self.name} on node {self.system.rank}] stopping at {self.value}")

    async def add(self, k: int = 1) -> int:
        """Add ``k`` (which must not be negative) and return the new value."""
        if k < 0:
            raise ValueError(f"cannot add {k}: a counter only goes up")
        self.value += k
        return self.value

    async def get(self) -> int:
        """The current value."""
        return self.value


async def main(system: actorch.ActorSystem) -> None:
    print(f"main runs on node {system.rank} of a {system.world_size}-node system")
    last = system.world_size - 1

    # Spawn on rank 1 (or on this node when the world has one node) under a name.
    a = await system.spawn(Counter, args=(10,), name="counters/a", on=min(1, last))
    b = await system.spawn(Counter, name="counters/b", on=last)
    print(f"spawned {a!r} and {b!r}")

    # A typed call: the method object gives mypy the argument and result types.
    value = await a.call(Counter.add, 5)
    print(f"a.call(Counter.add, 5) -> {value}")

    # The same endpoint by name.
    value = await a.call("add", 5)
    print(f"a.call('add', 5) -> {value}")

    # Fire and forget; messages from one caller start in the order they were sent,
    # so the next call sees this one's effect.
    a.tell(Counter.add, 1)
    print(f"after a.tell(Counter.add, 1): a.get -> {await a.call(Counter.get)}")

    # Find an actor by name from anywhere in the system.
    same = await system.lookup("counters/a")
    print(f"lookup('counters/a') -> {same!r} (same actor: {same == a})")

    # List actors by glob.
    every = await system.lookup_all("counters/*")
    print(f"lookup_all('counters/*') -> {[ref.name for ref in every]}")

    # A remote exception arrives as its original type (and as actorch.RemoteError).
    try:
        await a.call(Counter.add, -3)
    except ValueError as exc:
        print(f"caught {type(exc).__name__} from node {a.rank}: {exc}")
        print(f"  also an actorch.RemoteError: {isinstance(exc, actorch.RemoteError)}")

    # Deadlines come from the caller's scope and travel with the call.
    async with asyncio.timeout(5):
        print(f"b.call(Counter.add, 2) within 5 s -> {await b.call(Counter.add, 2)}")

    # Stopping runs on_stop and removes the name everywhere.
    await a.stop()
    print(f"stopped a; lookup_all('counters/*') -> {[ref.name for ref in await system.lookup_all('counters/*')]}")
    try:
        await a.call(Counter.get)
    except actorch.ActorStoppedError as exc:
        print(f"calling a stopped actor raises ActorStoppedError: {exc}")
    print("done; b is stopped when the system shuts down")


if __name__ == "__main__":
    actorch.run(main, world_size=3)
