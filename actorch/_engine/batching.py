"""Batched endpoints: ``@batched`` and the collection of concurrent calls into one run.

A batched endpoint is written for a list: ``async def act(self, states: list[S])
-> list[A]``. Each caller still sends one item and gets one result back, while
the mailbox gathers the calls that arrive while a batch is open and runs the
method once for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from actorch._base.deadline import inherited_deadline
from actorch._base.errors import ActorStoppedError, EndpointError
from actorch._engine.message import CallContext, Envelope, current_call
from actorch._engine.wire import HANDLER, RUNTIME

if TYPE_CHECKING:
    from actorch._engine.cell import Cell

__all__ = ["Batch", "Batched", "Endpoint", "answer_all", "batched", "close", "join", "leave", "run"]

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")

BatchMethod = Callable[[S, list[T]], Awaitable[Sequence[R | Exception]]]


class Batched(Generic[S, T, R]):
    """An endpoint that runs once for a list of concurrent calls (made by :func:`batched`).

    On the class (``Agent.act``) it is what ``ref.call`` takes; on an instance
    (``self.act``) it is the plain method, which takes and returns lists.
    """

    def __init__(self, method: BatchMethod[S, T, R], max_batch: int | Callable[[Any], int], max_wait: float) -> None:
        self.__wrapped__ = method
        self.__name__: str = method.__name__
        self.__qualname__: str = method.__qualname__
        self.__doc__ = method.__doc__
        self.max_batch = max_batch
        self.max_wait = max_wait

    def __repr__(self) -> str:
        return f"<batched endpoint {self.__qualname__} max_batch={self.max_batch!r} max_wait={self.max_wait}>"

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Batched[S, T, R]: ...

    @overload
    def __get__(self, instance: S, owner: type[Any]) -> Callable[[list[T]], Awaitable[Sequence[R | Exception]]]: ...

    def __get__(self, instance: Any, owner: type[Any]) -> Any:
        if instance is None:
            return self
        return functools.partial(self.__wrapped__, instance)

    def limit(self, instance: object) -> int:
        """The most calls one batch takes now, for this actor instance."""
        limit = self.max_batch if isinstance(self.max_batch, int) else self.max_batch(instance)
        return max(1, int(limit))

    def check(self, args: Sequence[Any], kwargs: dict[str, Any], label: str) -> EndpointError | None:
        """The error for a call that does not pass exactly one positional argument, if any."""
        if len(args) == 1 and not kwargs:
            return None
        got = f"{len(args)} positional and {len(kwargs)} keyword arguments"
        return EndpointError(f"bad arguments for batched {self.__name__!r} of {label}: one item per call, {got} given")


Endpoint = Callable[..., Awaitable[Any]] | Batched[Any, Any, Any]
"""An endpoint as its class holds it: an ``async def`` function, or a batched one."""


def batched(
    *, max_batch: int | Callable[[Any], int] = 64, max_wait: float = 0.005
) -> Callable[[BatchMethod[S, T, R]], Batched[S, T, R]]:
    """Make an endpoint run once for many concurrent calls, each caller getting its own result.

    The method takes the list of the calls' items and returns one result per
    item, in order (a list, or anything indexable such as a tensor); an
    ``Exception`` in place of a result is raised at that caller alone. Callers
    pass exactly one item: ``await ref.call(Agent.act, state)``.

    A batch opens with its first call and waits its turn in the mailbox like any
    message; it takes calls until it holds ``max_batch`` or ``max_wait`` seconds
    have passed since it opened, then runs. Calls arriving while it runs open
    the next batch.

    Args:
        max_batch: The most calls per batch: an int, or a function of the actor
            instance (``lambda self: len(self.observers)``) read as calls arrive.
        max_wait: Seconds a batch waits for more calls after its first one.

    Raises:
        TypeError: The method is not an ``async def`` or an option is invalid.
    """
    if not callable(max_batch) and (not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1):
        raise TypeError(f"max_batch must be an int >= 1 or a function of the actor, not {max_batch!r}")
    if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or not 0 <= max_wait < math.inf:
        raise TypeError(f"max_wait must be a finite number of seconds >= 0, not {max_wait!r}")

    def decorate(method: BatchMethod[S, T, R]) -> Batched[S, T, R]:
        if isinstance(method, Batched):
            raise TypeError(f"{method.__qualname__} is already batched")
        if not inspect.iscoroutinefunction(method):
            raise TypeError(f"@batched needs an async def method, not {method!r}")
        return Batched(method, max_batch, float(max_wait))

    return decorate


class Batch:
    """The calls collected for one run of a batched endpoint."""

    __slots__ = ("closed", "endpoint", "members", "opened", "runner", "spec", "urgent_at", "wakeup")

    def __init__(self, spec: Batched[Any, Any, Any], endpoint: str, opened: float) -> None:
        self.spec = spec
        self.endpoint = endpoint
        self.opened = opened
        self.members: dict[Envelope, None] = {}  # calls not answered yet, in arrival order
        self.closed = False
        self.urgent_at = math.inf  # a member's deadline closes the window when half its time is spent
        self.runner: Envelope | None = None
        self.wakeup: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<Batch {self.endpoint} calls={len(self.members)} closed={self.closed}>"

    def add(self, envelope: Envelope, now: float) -> None:
        """Take a call into the batch."""
        envelope.batch = self
        self.members[envelope] = None
        if envelope.deadline is not None:
            self.urgent_at = min(self.urgent_at, now + (envelope.deadline - now) / 2)
        self.poke()

    def discard(self, envelope: Envelope) -> bool:
        """Take a call out of the batch to answer it; False if it was answered already."""
        if envelope in self.members:
            del self.members[envelope]
            envelope.batch = None
            return True
        return False

    def window_end(self) -> float:
        """When the batch stops waiting for more calls (event-loop time)."""
        return min(self.opened + self.spec.max_wait, self.urgent_at)

    def poke(self) -> None:
        """Wake the runner waiting for calls, to look again."""
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)

    async def collect(self, instance: object, loop: asyncio.AbstractEventLoop) -> None:
        """Wait until the batch is full, its window ends or it is closed."""
        while not self.closed and len(self.members) < self.spec.limit(instance):
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


# ---------------------------------------------------------------------- the runtime side, per cell


def join(cell: Cell, envelope: Envelope) -> None:
    """Add a call to the open batch of its endpoint, opening one (a mailbox message) if none is."""
    spec = cell.batched[envelope.endpoint]
    error = spec.check(envelope.args, envelope.kwargs, cell.label)
    if error is not None:
        cell.fail(envelope, error)
        return
    now = cell.node.loop.time()
    if envelope.deadline is not None and envelope.deadline <= now:
        cell.fail(envelope, TimeoutError(f"deadline passed before {envelope.endpoint!r} of {cell.label} began"))
        return
    batch = cell.batches.get(envelope.endpoint)
    if batch is None:
        batch = cell.batches[envelope.endpoint] = Batch(spec, envelope.endpoint, now)
        batch.add(envelope, now)
        opener = Envelope(envelope.endpoint, (), {}, cell.node.new_key(), envelope.chain, None, None)
        opener.runs = batch
        batch.runner = opener
        if cell.can_start(opener.chain):
            cell.start(opener)
        else:
            cell.enqueue(opener)
    else:
        batch.add(envelope, now)
        runner = batch.runner
        if runner is not None and runner.task is None and cell.is_reentrant(envelope.chain):
            with contextlib.suppress(ValueError):  # a call back into a caller of this batch: run it now
                cell.queue.remove(runner)
                cell.start(runner)
    if len(batch.members) >= spec.limit(cell.instance):
        close(cell, batch)


def close(cell: Cell, batch: Batch) -> None:
    """Take no more calls into ``batch``; the next call opens a new one."""
    batch.closed = True
    if cell.batches.get(batch.endpoint) is batch:
        del cell.batches[batch.endpoint]
    batch.poke()


def _answer(cell: Cell, member: Envelope, ok: bool, value: Any) -> None:
    """Answer one call of a batch, unless it was answered already."""
    batch = member.batch
    if batch is None or not batch.discard(member):
        return  # answered already (its deadline passed, or it was cancelled)
    if not ok:
        cell.fail(member, *value)
    elif member.respond is not None:
        member.respond(True, value)


def leave(cell: Cell, member: Envelope) -> None:
    """A caller gave up: answer its call now, and cancel the run if nobody else waits."""
    batch = member.batch
    assert batch is not None
    stopped = ActorStoppedError(f"call to {member.endpoint!r} of {cell.label} was cancelled")
    _answer(cell, member, False, (stopped, RUNTIME))
    runner = batch.runner
    if not batch.members and runner is not None and runner.task is not None and not runner.cancelled:
        runner.cancelled = True  # nobody waits for this batch any more
        runner.task.cancel()


async def run(cell: Cell, runner: Envelope, batch: Batch) -> None:
    """The mailbox message of a batch: collect calls, run the method once, answer each caller.

    Each caller keeps its own deadline: the run is bounded by the latest one,
    and a caller whose deadline passes first gets its ``TimeoutError`` then.
    """
    loop = cell.node.loop
    stopped = cell.interrupted(runner.endpoint, by_caller=runner.cancelled)
    try:
        await batch.collect(cell.instance, loop)
    except asyncio.CancelledError:
        close(cell, batch)
        answer_all(cell, list(batch.members), False, (stopped, RUNTIME))
        if not runner.cancelled:
            raise
        return
    close(cell, batch)
    now = loop.time()
    answer_all(cell, [m for m in batch.members if m.deadline is not None and m.deadline <= now], False, None)
    members = list(batch.members)
    if not members:
        return
    deadlines = [member.deadline for member in members]
    latest = None if None in deadlines else max(d for d in deadlines if d is not None)
    timeout = None if latest is None else asyncio.timeout_at(latest)
    timers = [loop.call_at(m.deadline, answer_all, cell, [m], False, None) for m in members if m.deadline is not None]
    chain = tuple(dict.fromkeys(key for member in members for key in member.chain))
    token = current_call.set(CallContext(cell, runner.key, chain, runner.endpoint))
    deadline_token = inherited_deadline.set(latest)
    cell.batched_calls += len(members)
    try:
        coroutine = batch.spec.__wrapped__(cell.instance, [member.args[0] for member in members])
        if timeout is None:
            results = await coroutine
        else:
            async with timeout:
                results = await coroutine
    except asyncio.CancelledError:
        answer_all(cell, members, False, (stopped, RUNTIME))
        if not runner.cancelled:
            raise
    except TimeoutError as exc:
        answer_all(cell, members, False, None if timeout is not None and timeout.expired() else (exc, HANDLER))
    except Exception as exc:  # noqa: BLE001 - the method's error goes to every caller of the batch
        answer_all(cell, members, False, (exc, HANDLER))
        cell.check_fatal(exc)
    else:
        _deliver_results(cell, runner.endpoint, members, results)
    finally:
        for timer in timers:
            timer.cancel()
        current_call.reset(token)
        inherited_deadline.reset(deadline_token)


def answer_all(cell: Cell, members: list[Envelope], ok: bool, value: Any) -> None:
    """Answer each call not answered yet; an error of None is the call's deadline passing."""
    for member in members:
        if value is None and not ok:
            late = TimeoutError(f"{member.endpoint!r} of {cell.label} ran past its deadline")
            _answer(cell, member, False, (late, RUNTIME))
        else:
            _answer(cell, member, ok, value)


def _deliver_results(cell: Cell, endpoint: str, members: list[Envelope], results: Any) -> None:
    try:
        count = len(results) if not isinstance(results, (str, bytes, dict)) else -1
    except TypeError:
        count = -1
    if count != len(members):
        what = f"{count} results" if count >= 0 else f"{type(results).__name__}"
        wrong = TypeError(
            f"batched {endpoint!r} of {cell.label} must return one result per call: got {what} for {len(members)} calls"
        )
        answer_all(cell, members, False, (wrong, HANDLER))
        return
    for index, member in enumerate(members):
        result = results[index]
        if isinstance(result, Exception):
            _answer(cell, member, False, (result, HANDLER))
        else:
            _answer(cell, member, True, result)
