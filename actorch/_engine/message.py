"""A message as an actor's mailbox holds it, where its outcome (or a stream's items) goes, and the call it serves.

A :class:`Message` is one call, tell or stream on its way through an actor's cell.
Its :class:`Reply` is where the outcome goes: a local caller's future, a
remote caller (through the callee), or, for a tell, the mailbox slot it gives
back. Errors carry an :class:`Origin`: raised by the handler, by the runtime,
or because the actor is no longer hosted. Calls to a batched endpoint gather in
a :class:`BatchRun`, which takes its turn in the mailbox as one message. A
stream's message has an :class:`Outlet` too, where its items go: its handler
runs the endpoint's generator only as far as the consumer's credits allow, and
closes it however the stream ends (its ``finally`` runs).
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections.abc import AsyncGenerator, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from actorch._transport.autograd import NO_CONTEXT

if TYPE_CHECKING:
    import torch

__all__ = ["BatchRun", "CallContext", "ItemRefused", "Message", "Origin", "Outlet", "Reply", "current_call"]


class Origin(enum.IntEnum):
    """Who raised an error that answers a message; it decides what the caller raises."""

    RUNTIME = 0
    """The runtime refused or ended the message: the caller gets the same actorch error."""
    HANDLER = 1
    """The handler raised: the caller gets a ``RemoteError`` (also an instance of the original class)."""
    GONE = 2
    """The actor's node no longer hosts it: the caller gets ``ActorStoppedError`` naming the actor it called."""


class Reply:
    """Where the outcome of a message goes; each kind of sender has its own."""

    __slots__ = ()

    def result(self, message: Message, value: Any) -> None:
        """The handler of ``message`` returned ``value``."""
        raise NotImplementedError

    def error(self, message: Message, exc: BaseException, origin: Origin) -> None:
        """``message`` ended with ``exc``."""
        raise NotImplementedError

    def origin(self) -> tuple[int, int, bool] | None:
        """The node that sent the message and the id it gave it, and whether that is a stream's; None: no such id.

        A call or a stream from another node has one (its call or stream id),
        which both ends know: instruments draw on it (the timeline's arrow).
        """
        return None


class CallContext:
    """The call a handler is serving: its actor, its key, its chain of callers, the actor's device and node.

    A handler run in its caller's task (a same-node call, a hook) is held in
    its actor's running handlers by this context: ``started`` and ``task`` say
    since when and where it runs, for ``actorch status`` and ``actorch stacks``.
    """

    __slots__ = ("carried", "chain", "device", "endpoint", "key", "label", "node", "started", "task")

    queued_at = 0  # as a message's: it never waits in the mailbox, it runs in its caller's task

    def __init__(
        self,
        label: str,
        key: int,
        chain: tuple[int, ...],
        endpoint: str,
        device: torch.device | None,
        node: int,
    ) -> None:
        self.label = label
        self.key = key
        self.chain = chain
        self.endpoint = endpoint
        self.device = device  # the actor's accelerator device, if it has one: staged tensors it receives go there
        self.node = node  # the rank of the node the actor lives on, for the log lines written in the call
        self.started = 0  # perf_counter_ns() when a handler run in place began (0: not one of those)
        self.task: asyncio.Task[Any] | None = None  # the task running it in place
        self.carried: dict[str, Any] | None = None  # what its caller's instruments carried (see ``instruments``)

    def __repr__(self) -> str:
        return f"<CallContext {self.label}.{self.endpoint} key={self.key:#x}>"

    def child_chain(self) -> tuple[int, ...]:
        """The chain a call made from this handler carries."""
        return (*self.chain, self.key)


current_call: ContextVar[CallContext | None] = ContextVar("actorch_call", default=None)


class Message:
    """A call or tell waiting for, or being handled by, an actor."""

    __slots__ = (
        "args",
        "autograd",
        "batch",
        "cancelled",
        "carried",
        "chain",
        "deadline",
        "endpoint",
        "key",
        "kwargs",
        "outlet",
        "queued_at",
        "reply",
        "runs",
        "started",
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
        reply: Reply | None,
    ) -> None:
        self.endpoint = endpoint
        self.args = args
        self.kwargs = kwargs
        self.key = key
        self.chain = chain
        self.deadline = deadline
        self.reply = reply
        self.task: asyncio.Task[None] | None = None
        self.cancelled = False
        self.autograd = NO_CONTEXT  # the distributed autograd context its handler runs in, if any
        self.batch: BatchRun | None = None  # the batch run this call joined
        self.runs: BatchRun | None = None  # the batch run this message is the mailbox turn of
        self.outlet: Outlet | None = None  # a stream's producing end: the message runs the generator into it
        self.queued_at = 0  # perf_counter_ns() when it joined its actor's queue (set only if it had to wait)
        self.started = 0  # perf_counter_ns() when its handler began (0: not yet)
        self.carried: dict[str, Any] | None = None  # what its sender's instruments carried (see ``instruments``)

    def __repr__(self) -> str:
        return f"<Message {self.endpoint} key={self.key:#x}>"


class BatchRun:
    """The calls collected for one run of a batched endpoint; it takes its mailbox turn as one message."""

    __slots__ = ("closed", "endpoint", "limit", "max_wait", "members", "opened", "turn", "urgent_at", "wakeup")

    def __init__(self, endpoint: str, limit: Callable[[], int], max_wait: float, opened: float) -> None:
        self.endpoint = endpoint
        self.limit = limit  # the most calls it takes, read as they arrive
        self.max_wait = max_wait
        self.opened = opened
        self.members: dict[Message, None] = {}  # calls not answered yet, in arrival order
        self.closed = False
        self.urgent_at = math.inf  # a member's deadline closes the window when half its time is spent
        self.turn: Message | None = None  # the message that runs it
        self.wakeup: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<BatchRun {self.endpoint} calls={len(self.members)} closed={self.closed}>"

    def add(self, message: Message, now: float) -> None:
        """Take a call into the batch."""
        message.batch = self
        self.members[message] = None
        if message.deadline is not None:
            self.urgent_at = min(self.urgent_at, now + (message.deadline - now) / 2)
        self.poke()

    def discard(self, message: Message) -> bool:
        """Take a call out of the batch to answer it; False if it was answered already."""
        if message in self.members:
            del self.members[message]
            message.batch = None
            return True
        return False

    def window_end(self) -> float:
        """When the batch stops waiting for more calls (event-loop time)."""
        return min(self.opened + self.max_wait, self.urgent_at)

    def poke(self) -> None:
        """Wake the run waiting for calls, to look again."""
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    async def collect(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait until the batch is full, its window ends or it is closed."""
        while not self.closed and len(self.members) < self.limit():
            end = self.window_end()
            if loop.time() >= end:
                return
            self.wakeup = loop.create_future()
            timer = loop.call_at(end, self.poke)
            try:
                await self.wakeup
            finally:
                timer.cancel()
                self.wakeup = None


class ItemRefused(Exception):  # noqa: N818 - a carrier, never raised to users
    """An item could not be sent (it cannot be encoded, or it is too large): the stream ends with ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Outlet:
    """Where a stream's items go, and how many more the consumer will take (its credits)."""

    __slots__ = ("_loop", "_wakeup", "credit", "message", "sent")

    def __init__(self, loop: asyncio.AbstractEventLoop, window: int) -> None:
        self._loop = loop
        self._wakeup: asyncio.Future[None] | None = None
        self.credit = window
        self.sent = 0
        self.message: Message | None = None  # the stream's message in its actor's mailbox

    def __repr__(self) -> str:
        return f"<{type(self).__name__} sent={self.sent} credit={self.credit}>"

    def more(self, count: int) -> None:
        """The consumer took ``count`` items: the producer may make that many more."""
        self.credit += count
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def put(self, item: Any) -> None:
        """Deliver one item (the ``sent``-th, from 0) to the consumer; raise :class:`ItemRefused` if it cannot go."""
        raise NotImplementedError

    async def pump(self, items: AsyncGenerator[Any, None], running: set[Outlet]) -> None:
        """Run ``items`` to its end, one item per credit; close it however the stream ends.

        The outlet is in ``running`` (its actor's) meanwhile, so that stopping the actor can end it.
        """
        running.add(self)
        try:
            while True:
                while self.credit <= 0:
                    self._wakeup = self._loop.create_future()
                    try:
                        await self._wakeup
                    finally:
                        self._wakeup = None
                try:
                    item = await items.__anext__()
                except StopAsyncIteration:
                    return
                self.credit -= 1
                self.put(item)
                self.sent += 1
        finally:
            running.discard(self)
            await items.aclose()  # a no-op if it ended; else GeneratorExit at its yield: its finally runs
