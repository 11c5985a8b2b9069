"""Actors that misbehave on purpose, for the fault tests (importable on every rank as ``faulty``)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from actors import describe

import actorch


class Stuck(actorch.Actor):
    """Handlers that never return: one that can be cancelled, one that refuses, one that blocks the loop."""

    max_concurrency = 4

    async def forever(self) -> None:
        await asyncio.Event().wait()

    async def stubborn(self) -> None:
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    async def block(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - blocking the event loop is the fault under test

    async def hold_asleep(self, seconds: int) -> None:
        """Sleep in a C call that keeps the GIL: no thread of the process runs, yet it is alive."""
        ctypes.PyDLL(None).sleep(seconds)

    async def hold_busy(self, seconds: float) -> None:
        """Compute for ``seconds`` without letting another thread run (the GIL kept, as a long C call keeps it)."""
        switching = sys.getswitchinterval()
        sys.setswitchinterval(10 * seconds)
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                pass
        finally:
            sys.setswitchinterval(switching)

    async def pid(self) -> int:
        return os.getpid()


class HangingStop(actorch.Actor):
    """Its ``on_stop`` never finishes by itself; it notes that it began."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def on_stop(self) -> None:
        Path(self.path).write_text("on_stop began\n")  # noqa: ASYNC240 - a test marker, tiny
        await asyncio.Event().wait()

    async def get(self) -> int:
        return 1


class Caller(actorch.Actor):
    """Calls an actor on another node over and over; writes how that ended to ``path`` when it stops."""

    max_concurrency = 2

    def __init__(self, path: str) -> None:
        self.path = path
        self.calls = 0
        self.ended: dict[str, Any] | None = None

    async def keep_calling(self, target: actorch.ActorRef[Any], seconds: float, pause: float = 0.05) -> None:
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                await target.call("get")
                self.calls += 1
                await asyncio.sleep(pause)
        except BaseException as exc:  # a NodeLostError, or cancelled: its own caller was lost
            self.ended = describe(exc)
            raise

    async def report(self) -> dict[str, Any]:
        return {"calls": self.calls, "ended": self.ended}

    async def on_stop(self) -> None:
        report = {"calls": self.calls, "ended": self.ended, "pid": os.getpid(), "at": time.time()}
        Path(self.path).write_text(json.dumps(report))  # noqa: ASYNC240 - a test report, tiny
