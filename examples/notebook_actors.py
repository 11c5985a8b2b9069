"""The actors of ``examples/notebook.ipynb``, in a module of their own so that the worker processes can import them.

A class defined in a notebook cell lives in the kernel's ``__main__``, which
the workers cannot import: it can run on rank 0 only.
"""

from __future__ import annotations

import asyncio
import os

import actorch


class Counter(actorch.Actor):
    """Counts, and says where it runs."""

    def __init__(self, start: int = 0) -> None:
        self.value = start

    async def add(self, k: int = 1) -> int:
        """Add ``k`` and return the new value."""
        self.value += k
        return self.value

    async def add_slowly(self, k: int, seconds: float) -> int:
        """Add ``k`` after ``seconds``: long enough to interrupt, or to meet a deadline."""
        await asyncio.sleep(seconds)
        return await self.add(k)

    async def share(self, parts: int) -> float:
        """The value split in ``parts`` (``ZeroDivisionError`` for none)."""
        return self.value / parts

    async def pid(self) -> int:
        """The process this actor runs in."""
        return os.getpid()
