"""The walk-through of docs/multi-host.md: one launcher per host, an actor on host B found by name from host A.

Run on each host as ``actorch run -n 1 --nnodes 2 --node-rank R --master-addr A
--master-port P two_hosts.py``. Rank 0 (host A) spawns a counter on rank 1
(host B) under a name, finds it by that name and calls it.
"""

from __future__ import annotations

from actors import Counter, emit

import actorch


async def main(system: actorch.ActorSystem) -> str:
    await system.spawn(Counter, args=(41,), name="hosts/b/counter", on=1)
    found = await system.lookup("hosts/b/counter")
    emit(
        "two_hosts",
        world_size=system.world_size,
        where=await found.call(Counter.where),
        value=await found.call(Counter.add),
        pids={str(info.rank): info.pid for info in system.nodes},
    )
    return "found"


if __name__ == "__main__":
    # The "hosts" of the tests are network namespaces of one machine, which share its /dev/shm: send every
    # tensor over the network, as between real hosts.
    print("RETURNED", repr(actorch.run(main, channels=["staged"])), flush=True)
