"""Batched endpoints: ``@batched`` and the collection of concurrent calls into one run.

A batched endpoint is written for a list: ``async def act(self, states: list[S])
-> list[A]``. Each caller still sends one item and gets one result back, while
the mailbox gathers the calls that arrive while a batch is open and runs the
method once for all of them. A cell with batched endpoints has a :class:`Batcher`,
which sees the cell only through the :class:`BatchHost` methods.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from actorch._base.config import is_count, is_number
from actorch._base.deadline import inherited_deadline
from actorch._base.devices import on_device
from actorch._base.errors import ActorStoppedError, EndpointError
from actorch._engine.message import BatchRun, CallContext, Message, Origin, current_call
from actorch._transport.autograd import NO_CONTEXT, bound

if TYPE_CHECKING:
    import torch

    from actorch._engine.instruments import Instruments

__all__ = ["BatchHost", "Batched", "Batcher", "batched"]

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
    if not callable(max_batch) and not is_count(max_batch):
        raise TypeError(f"max_batch must be an int >= 1 or a function of the actor, not {max_batch!r}")
    if not is_number(max_wait):
        raise TypeError(f"max_wait must be a finite number of seconds >= 0, not {max_wait!r}")

    def decorate(method: BatchMethod[S, T, R]) -> Batched[S, T, R]:
        if isinstance(method, Batched):
            raise TypeError(f"{method.__qualname__} is already batched")
        if not inspect.iscoroutinefunction(method):
            raise TypeError(f"@batched needs an async def method, not {method!r}")
        return Batched(method, max_batch, float(max_wait))

    return decorate


class BatchHost(Protocol):
    """What a :class:`Batcher` needs of its actor's cell."""

    actor_id: int
    label: str
    instance: object
    loop: asyncio.AbstractEventLoop
    device: torch.device | None
    node: int  # the rank of the node hosting the actor
    metrics: dict[str, Any]  # what the metrics instrument counts of its endpoints
    instruments: Instruments  # what observes its node's messages

    def new_key(self) -> int:
        """A message key, unique in the system."""

    def schedule(self, message: Message) -> None:
        """Start ``message`` now if the mailbox allows, else queue it (no batching)."""

    def run_now(self, message: Message) -> None:
        """Start a queued ``message`` at once (it serves a call the actor is handling)."""

    def is_reentrant(self, chain: tuple[int, ...]) -> bool:
        """Whether a call with this chain comes back to a call the actor is handling."""

    def fail(self, message: Message, exc: BaseException, origin: Origin = Origin.RUNTIME) -> None:
        """Answer ``message`` with an error."""

    def interrupted(self, endpoint: str, *, by_caller: bool) -> ActorStoppedError:
        """The error for a call whose handler was cancelled."""

    def check_fatal(self, exc: BaseException) -> None:
        """Fail the actor if ``exc`` is fatal to its class."""


class Batcher:
    """One cell's batched endpoints: the open batch run of each, and the calls they answered."""

    __slots__ = ("calls", "host", "open", "specs")

    def __init__(self, host: BatchHost, specs: Mapping[str, Batched[Any, Any, Any]]) -> None:
        self.host = host
        self.specs = dict(specs)
        self.open: dict[str, BatchRun] = {}  # the open batch run of each batched endpoint
        self.calls = 0

    def __repr__(self) -> str:
        return f"<Batcher {self.host.label} endpoints={sorted(self.specs)} calls={self.calls}>"

    def join(self, message: Message) -> None:
        """Add a call to the open run of its endpoint, opening one (a mailbox message) if none is."""
        host = self.host
        spec = self.specs[message.endpoint]
        error = spec.check(message.args, message.kwargs, host.label)
        if error is not None:
            host.fail(message, error)
            return
        now = host.loop.time()
        if message.deadline is not None and message.deadline <= now:
            host.fail(message, TimeoutError(f"deadline passed before {message.endpoint!r} of {host.label} began"))
            return
        run = self.open.get(message.endpoint)
        if run is None:
            run = self.open[message.endpoint] = BatchRun(
                message.endpoint, lambda: spec.limit(host.instance), spec.max_wait, now
            )
            run.add(message, now)
            turn = Message(message.endpoint, (), {}, host.new_key(), message.chain, None, None)
            turn.runs = run
            run.turn = turn
            host.schedule(turn)
        else:
            run.add(message, now)
            waiting = run.turn
            if waiting is not None and waiting.task is None and host.is_reentrant(message.chain):
                host.run_now(waiting)  # a call back into a caller of this batch: run it now
        if len(run.members) >= run.limit():
            self.close(run)

    def close(self, run: BatchRun) -> None:
        """Take no more calls into ``run``; the next call opens a new one."""
        run.closed = True
        if self.open.get(run.endpoint) is run:
            del self.open[run.endpoint]
        run.poke()

    def leave(self, member: Message) -> None:
        """A caller gave up: answer its call now, and cancel the run if nobody else waits."""
        run = member.batch
        assert run is not None
        stopped = ActorStoppedError(f"call to {member.endpoint!r} of {self.host.label} was cancelled")
        self._answer_error(member, stopped, Origin.RUNTIME)
        turn = run.turn
        if not run.members and turn is not None and turn.task is not None and not turn.cancelled:
            turn.cancelled = True  # nobody waits for this batch any more
            turn.task.cancel()

    def fail_unrun(self, turn: Message, exc: BaseException, origin: Origin) -> None:
        """A run's turn ends before it ran (the actor stops or failed): each of its calls gets ``exc``."""
        run, turn.runs = turn.runs, None
        assert run is not None
        self.close(run)
        self.fail_all(list(run.members), exc, origin)

    def fail_open(self, error: Callable[[str], BaseException]) -> None:
        """Answer the calls of every open run with ``error(endpoint)``."""
        for run in list(self.open.values()):
            self.close(run)
            self.fail_all(list(run.members), error(run.endpoint), Origin.RUNTIME)

    async def run(self, turn: Message, run: BatchRun) -> int:
        """The mailbox turn of a batch: collect calls, run the method once, answer each caller; how many it ran.

        Each caller keeps its own deadline: the run is bounded by the latest one,
        and a caller whose deadline passes first gets its ``TimeoutError`` then.
        """
        host = self.host
        loop = host.loop
        stopped = host.interrupted(turn.endpoint, by_caller=turn.cancelled)
        try:
            await run.collect(loop)
        except asyncio.CancelledError:
            self.close(run)
            self.fail_all(list(run.members), stopped, Origin.RUNTIME)
            if not turn.cancelled:
                raise
            return 0
        self.close(run)
        now = loop.time()
        self.time_out([m for m in run.members if m.deadline is not None and m.deadline <= now])
        members = list(run.members)
        if members:
            await self._call_method(turn, members, stopped)
        return len(members)

    async def _call_method(self, turn: Message, members: list[Message], stopped: ActorStoppedError) -> None:
        """Run the batched method once for ``members`` and answer each, within the latest of their deadlines."""
        host = self.host
        loop = host.loop
        deadlines = [member.deadline for member in members]
        latest = None if None in deadlines else max(d for d in deadlines if d is not None)
        timeout = None if latest is None else asyncio.timeout_at(latest)
        timers = [loop.call_at(m.deadline, self.time_out, [m]) for m in members if m.deadline is not None]
        chain = tuple(dict.fromkeys(key for member in members for key in member.chain))
        token = current_call.set(CallContext(host.label, turn.key, chain, turn.endpoint, host.device, host.node))
        deadline_token = inherited_deadline.set(latest)
        self.calls += len(members)
        try:
            coroutine = on_device(
                self.specs[turn.endpoint].__wrapped__(host.instance, [member.args[0] for member in members]),
                host.device,
            )
            coroutine = self._wrapped(coroutine, turn.endpoint, members)
            if timeout is None:
                results = await coroutine
            else:
                async with timeout:
                    results = await coroutine
        except asyncio.CancelledError:
            self.fail_all(members, stopped, Origin.RUNTIME)
            if not turn.cancelled:
                raise
        except TimeoutError as exc:
            if timeout is not None and timeout.expired():
                self.time_out(members)
            else:
                self.fail_all(members, exc, Origin.HANDLER)
        except Exception as exc:  # noqa: BLE001 - the method's error goes to every caller of the batch
            self.fail_all(members, exc, Origin.HANDLER)
            host.check_fatal(exc)
        else:
            self._deliver_results(turn.endpoint, members, results)
        finally:
            for timer in timers:
                timer.cancel()
            current_call.reset(token)
            inherited_deadline.reset(deadline_token)

    def _wrapped(self, coroutine: Awaitable[Any], endpoint: str, members: list[Message]) -> Awaitable[Any]:
        """``coroutine`` as the run runs it: in its first caller's autograd context, wrapped by its instruments."""
        context = next((member.autograd for member in members if member.autograd != NO_CONTEXT), NO_CONTEXT)
        if context != NO_CONTEXT:  # the run is recorded in its first caller's distributed autograd context
            coroutine = bound(coroutine, context)
        serving = self.host.instruments.serving_batch
        if serving is not None:
            coroutine = serving(self.host, endpoint, coroutine, [member.carried for member in members])
        return coroutine

    def fail_all(self, members: list[Message], exc: BaseException, origin: Origin) -> None:
        """Answer each call not answered yet with ``exc``."""
        for member in members:
            self._answer_error(member, exc, origin)

    def time_out(self, members: list[Message]) -> None:
        """Answer each call not answered yet with its deadline passing."""
        for member in members:
            late = TimeoutError(f"{member.endpoint!r} of {self.host.label} ran past its deadline")
            self._answer_error(member, late, Origin.RUNTIME)

    def _answer_error(self, member: Message, exc: BaseException, origin: Origin) -> None:
        run = member.batch
        if run is not None and run.discard(member):  # else answered already (a deadline, a cancellation)
            self.host.fail(member, exc, origin)

    def _answer(self, member: Message, value: Any) -> None:
        run = member.batch
        if run is not None and run.discard(member) and member.reply is not None:
            member.reply.result(member, value)

    def _deliver_results(self, endpoint: str, members: list[Message], results: Any) -> None:
        try:
            count = len(results) if not isinstance(results, (str, bytes, dict)) else -1
        except TypeError:
            count = -1
        if count != len(members):
            what = f"{count} results" if count >= 0 else f"{type(results).__name__}"
            wrong = TypeError(
                f"batched {endpoint!r} of {self.host.label} must return one result per call: "
                f"got {what} for {len(members)} calls"
            )
            self.fail_all(members, wrong, Origin.HANDLER)
            return
        for index, member in enumerate(members):
            result = results[index]
            if isinstance(result, Exception):
                self._answer_error(member, result, Origin.HANDLER)
            else:
                self._answer(member, result)
