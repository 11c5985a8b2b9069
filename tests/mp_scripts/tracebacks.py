"""An actor's error escapes ``main``: Python prints the remote frames under the local ones.

Usage: ``python tracebacks.py``. Before that, the same-node call, a stream and a
chain of two calls each print their caught error's traceback as Python would
print it (``traceback.format_exception``) in a ``RESULT`` line.
"""

from __future__ import annotations

import traceback
from collections.abc import AsyncIterator

from actors import emit

import actorch


class Checker(actorch.Actor):
    async def check(self, rows: int, cols: int) -> int:
        if rows != cols:
            raise ValueError(f"a {rows}x{cols} matrix is not square")  # the line the traceback must show
        return rows

    async def rows(self, count: int) -> AsyncIterator[int]:
        for row in range(count):
            yield row
        raise KeyError(f"row {count} is missing")  # the line a stream's traceback must show

    async def relay(self, other: actorch.ActorRef[Checker], rows: int, cols: int) -> int:
        return await other.call(Checker.check, rows, cols)  # the line of the middle actor


async def printed(awaitable: object) -> str:
    """What Python prints for the error ``awaitable`` raises."""
    try:
        if isinstance(awaitable, AsyncIterator):
            async for _ in awaitable:
                pass
        else:
            await awaitable  # type: ignore[misc]
    except Exception as exc:
        return "".join(traceback.format_exception(exc))
    return "nothing raised"


async def main(system: actorch.ActorSystem) -> None:
    here = await system.spawn(Checker, name="shapes/here", on=0)
    there = await system.spawn(Checker, name="shapes/there", on=1)
    emit("same_node", text=await printed(here.call(Checker.check, 2, 3)))
    emit("stream", text=await printed(there.stream(Checker.rows, 2)))
    emit("chain", text=await printed(here.call(Checker.relay, there, 4, 5)))
    await there.call(Checker.check, 3, 4)  # not caught: run() re-raises it, Python prints it


if __name__ == "__main__":
    actorch.run(main, world_size=2)
