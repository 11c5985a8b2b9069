"""The message a mailbox holds, and the context of the call a handler is serving."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actorch._engine.batching import Batch
    from actorch._engine.cell import Cell

__all__ = ["CallContext", "Envelope", "Respond", "current_call"]

Respond = Callable[[bool, Any], None]


class CallContext:
    """The call a handler is serving: its actor cell, its key and its chain of callers."""

    __slots__ = ("cell", "chain", "endpoint", "key")

    def __init__(self, cell: Cell, key: int, chain: tuple[int, ...], endpoint: str) -> None:
        self.cell = cell
        self.key = key
        self.chain = chain
        self.endpoint = endpoint

    def __repr__(self) -> str:
        return f"<CallContext {self.cell.label}.{self.endpoint} key={self.key:#x}>"

    def child_chain(self) -> tuple[int, ...]:
        """The chain a call made from this handler carries."""
        return (*self.chain, self.key)


current_call: ContextVar[CallContext | None] = ContextVar("actorch_call", default=None)


class Envelope:
    """A message waiting for, or being handled by, an actor."""

    __slots__ = (
        "args",
        "batch",
        "cancelled",
        "chain",
        "deadline",
        "endpoint",
        "key",
        "kwargs",
        "respond",
        "runs",
        "task",
    )

    def __init__(
        self,
        endpoint: str,
        args: list[Any] | tuple[Any, ...],
        kwargs: dict[str, Any],
        key: int,
        chain: tuple[int, ...],
        deadline: float | None,
        respond: Respond | None,
    ) -> None:
        self.endpoint = endpoint
        self.args = args
        self.kwargs = kwargs
        self.key = key
        self.chain = chain
        self.deadline = deadline
        self.respond = respond
        self.task: asyncio.Task[None] | None = None
        self.cancelled = False
        self.batch: Batch | None = None  # the batch this call joined
        self.runs: Batch | None = None  # the batch this message runs

    def __repr__(self) -> str:
        return f"<Envelope {self.endpoint} key={self.key:#x}>"
