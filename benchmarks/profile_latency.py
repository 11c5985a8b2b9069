"""Where one sequential call's time goes, from the caller's ``await`` to its return, across both processes.

Rank 0 awaits 1,000 no-op calls one after another to an actor on rank 1, as
``bench_rpc.py`` (a) does. Both ranks stamp the moments a call passes: the bundle
handed to torch, the torch thread posting what arrived, the event loop taking
it, the call delivered to its actor, the handler returning, the reply set on the
bundle's response. Both clocks are the machine's (``perf_counter``), so the
stamps of the two processes compare; the table gives the median of each stretch.

    python benchmarks/profile_latency.py
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import actorch
from actorch._engine import callee as callee_module
from actorch._transport import base, bridge
from actorch._transport.torch_rpc import rpc as rpc_module

CALLS = 1000
_stamps: list[tuple[str, float]] = []


class Echo(actorch.Actor):
    async def noop(self) -> None:
        return None

    async def stamps(self) -> list[tuple[str, float]]:
        return list(_stamps)

    async def clear(self) -> None:
        _stamps.clear()


def _stamped(name: str, original: Any, *, after: bool = False) -> Any:
    def stamped(*args: Any) -> Any:
        if not after:
            _stamps.append((name, time.perf_counter()))
        result = original(*args)
        if after:
            _stamps.append((name, time.perf_counter()))
        return result

    return stamped


def _install(rank: int) -> None:
    """Stamp the moments a message passes on this node (``run``'s ``setup``, on every node)."""
    bridge.Inbox.post = _stamped("posted", bridge.Inbox.post)  # type: ignore[method-assign]
    bridge.Inbox._drain = _stamped("drained", bridge.Inbox._drain)  # type: ignore[method-assign]
    rpc_module.RpcTransport._rpc_bundle = _stamped("sent", rpc_module.RpcTransport._rpc_bundle)  # type: ignore[method-assign]
    callee_module.Callee.on_call = _stamped("delivered", callee_module.Callee.on_call, after=True)  # type: ignore[method-assign]
    callee_module.CallReply.result = _stamped("returned", callee_module.CallReply.result)  # type: ignore[method-assign]
    close = base.Port.close

    def closed(port: base.Port) -> None:
        if not port.closed:
            _stamps.append(("responded", time.perf_counter()))
        close(port)

    base.Port.close = closed  # type: ignore[method-assign]


def _times(stamps: list[tuple[str, float]], name: str) -> list[float]:
    return [moment for kind, moment in stamps if kind == name]


async def main(system: actorch.ActorSystem) -> None:
    ref = await system.spawn(Echo, on=1)
    for _ in range(300):
        await ref.call(Echo.noop)
    await ref.call(Echo.clear)  # its own reply is stamped after the clear: drop the first "responded" below
    _stamps.clear()
    starts, ends = [], []
    for _ in range(CALLS):
        starts.append(time.perf_counter())
        await ref.call(Echo.noop)
        ends.append(time.perf_counter())
    mine, theirs = list(_stamps), await ref.call(Echo.stamps)
    sent, posted, drained = (_times(mine, name)[:CALLS] for name in ("sent", "posted", "drained"))
    their_posted, their_drained = (_times(theirs, name)[:CALLS] for name in ("posted", "drained"))
    delivered = _times(theirs, "delivered")[:CALLS]
    returned, responded = (_times(theirs, name)[1 : CALLS + 1] for name in ("returned", "responded"))
    stretches = {
        "caller: call made -> bundle handed to torch": (starts, sent),
        "torch: request -> callee's torch thread posts it": (sent, their_posted),
        "callee: posted -> its event loop takes it": (their_posted, their_drained),
        "callee: taken -> delivered to the actor": (their_drained, delivered),
        "callee: delivered -> handler returned": (delivered, returned),
        "callee: returned -> reply set on the response": (returned, responded),
        "torch: response -> caller's torch thread posts it": (responded, posted),
        "caller: posted -> its event loop takes it": (posted, drained),
        "caller: taken -> the await returns": (drained, ends),
        "total": (starts, ends),
    }
    print(f"medians of {CALLS:,} sequential no-op calls, microseconds")
    for label, (begin, end) in stretches.items():
        print(f"{label:52} {statistics.median(b - a for a, b in zip(begin, end, strict=False)) * 1e6:8.1f}")


if __name__ == "__main__":
    actorch.run(main, world_size=2, setup=_install)
