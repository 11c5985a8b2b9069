"""``main`` raises: ``actorch.run`` shuts the world down and re-raises it (the script exits non-zero).

Usage: ``python main_raises.py TMPDIR``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from actors import Counter, Stopper, emit

import actorch

TMP = Path(sys.argv[1])
RAISED: list[BaseException] = []
RAISED_AT: list[float] = []


class MainFailedError(RuntimeError):
    """What main raises on purpose."""


async def main(system: actorch.ActorSystem) -> None:
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank1"),), on=1)
    await system.spawn(Stopper, args=(str(TMP / "on_stop_rank0"),), on=0)
    c = await system.spawn(Counter, on=1)
    emit("before_raise", value=await c.call(Counter.add, 1))
    error = MainFailedError("main failed on purpose \u2717")
    RAISED.append(error)
    RAISED_AT.append(time.monotonic())
    raise error


if __name__ == "__main__":
    try:
        actorch.run(main, world_size=2)
    except BaseException as exc:
        emit(
            "raised",
            type=type(exc).__name__,
            same_object=bool(RAISED) and exc is RAISED[0],
            seconds_after_raise=time.monotonic() - RAISED_AT[0] if RAISED_AT else None,
        )
        raise
    emit("raised", type=None)
