"""Two actor systems, one after the other, from the same script process.

Usage: ``python two_worlds.py``. Each world has fresh worker processes, while
rank 0 is the same process both times; it reports which address rank 0's
rendezvous store listened on.
"""

from __future__ import annotations

import os
from typing import Any

from actors import Counter, emit

import actorch


def listening_addresses() -> list[str]:
    """Local addresses of this process's listening TCP sockets, from /proc."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.islink(f"/proc/self/fd/{fd}") else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    found.append(fields[1])
    return found


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    counter = await system.spawn(Counter, args=(10,), name="worlds/c", on=1)
    value = await counter.call(Counter.add, 1)
    return {"value": value, "worker_pid": system.nodes[1].pid, "listening": listening_addresses()}


if __name__ == "__main__":
    first = actorch.run(main, world_size=2)
    second = actorch.run(main, world_size=2)
    emit("two_worlds", first=first, second=second, main_pid=os.getpid())
