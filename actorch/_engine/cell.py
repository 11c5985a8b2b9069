"""One hosted actor's mailbox: who may run now, who waits, and re-entrant calls.

A ``Cell`` runs at most ``max_concurrency`` messages at once, starting them in
arrival order. A call whose chain of callers contains a call the actor is
handling right now (A → B → A) is re-entrant: it runs at once instead of
waiting behind the call it came from, which would never finish. Calls to a
batched endpoint join the open batch of that endpoint; the batch is one message
in the mailbox. A cell is paused while its actor is being restarted: messages
wait in the queue for the new instance.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from actorch._base.deadline import inherited_deadline
from actorch._base.errors import ActorStoppedError, EndpointError
from actorch._engine import batching as _batching
from actorch._engine.batching import Batch, Batched, Endpoint
from actorch._engine.message import CallContext, Envelope, current_call
from actorch._engine.wire import HANDLER, RUNTIME, describe, is_refusal, log_tell_failure

if TYPE_CHECKING:
    from actorch._engine.node import Node

__all__ = ["Cell", "Endpoint"]


class Cell:
    """A hosted actor: its instance, endpoints, mailbox and counters."""

    __slots__ = (
        "active",
        "actor_id",
        "batched",
        "batched_calls",
        "batches",
        "endpoints",
        "evicted",
        "failure",
        "fatal",
        "handled",
        "idle",
        "idle_at",
        "inline",
        "instance",
        "label",
        "max_concurrency",
        "name",
        "node",
        "paused",
        "queue",
        "queued_peak",
        "restarts",
        "running",
        "stopped_hook",
        "stopping",
        "tasks",
        "unbegun",
    )

    def __init__(
        self,
        node: Node,
        actor_id: int,
        instance: object,
        endpoints: Mapping[str, Endpoint],
        *,
        name: str | None,
        max_concurrency: int,
    ) -> None:
        self.node = node
        self.actor_id = actor_id
        self.instance = instance
        self.endpoints = {name: handler for name, handler in endpoints.items() if not isinstance(handler, Batched)}
        self.batched = {name: handler for name, handler in endpoints.items() if isinstance(handler, Batched)}
        self.batches: dict[str, Batch] = {}  # the open batch of each batched endpoint
        self.batched_calls = 0
        self.name = name
        self.max_concurrency = max_concurrency
        self.label = (
            f"actor {name!r} ({type(instance).__name__}) on node {node.rank}"
            if name
            else f"actor {type(instance).__name__}#{actor_id} on node {node.rank}"
        )
        self.running = 0
        self.unbegun = 0  # worker tasks created whose first message has not begun yet
        self.handled = 0
        self.queue: deque[Envelope] = deque()
        self.queued_peak = 0
        self.active: set[int] = set()
        self.stopping = False
        self.paused = False  # while the actor restarts: nothing starts, messages wait
        self.failure: BaseException | None = None  # the fatal error being recovered from
        self.fatal: tuple[type[BaseException], ...] = getattr(type(instance), "fatal_errors", ())
        self.restarts = 0
        self.stopped_hook = False  # on_stop ran for the current instance
        self.tasks: set[asyncio.Task[None]] = set()
        self.inline: dict[asyncio.Task[Any], int] = {}  # callers' tasks running a handler inline, and how deep
        self.evicted: set[asyncio.Task[Any]] = set()  # inline callers cancelled because the actor stopped
        self.idle: asyncio.Future[None] | None = None
        self.idle_at = 0

    def __repr__(self) -> str:
        return f"<Cell {self.label} running={self.running} queued={len(self.queue)}>"

    def statistics(self) -> dict[str, int]:
        """Messages handled, running, queued (now and at most), restarts; calls answered in batches."""
        counts = {
            "handled": self.handled,
            "running": self.running,
            "queued": len(self.queue),
            "queued_peak": self.queued_peak,
            "restarts": self.restarts,
        }
        if self.batched:
            counts["batched_calls"] = self.batched_calls
        return counts

    def is_reentrant(self, chain: tuple[int, ...]) -> bool:
        """Whether a call with this chain comes back to a call this actor is handling."""
        return bool(chain) and bool(self.active) and not self.active.isdisjoint(chain)

    def can_start(self, chain: tuple[int, ...]) -> bool:
        """Whether a new message may start now rather than wait in the queue.

        Not while a worker started earlier has yet to begin its message: messages
        start in the order they arrived, also when several may run at once.
        """
        if self.paused:
            return False
        free = self.running < self.max_concurrency and not self.queue and not self.unbegun
        return free or self.is_reentrant(chain)

    def enter(self, key: int) -> None:
        """Count a message as running."""
        self.running += 1
        self.active.add(key)

    def leave(self, key: int) -> None:
        """Count a message as done (the caller then takes or starts the next ones)."""
        self.running -= 1
        self.handled += 1
        self.active.discard(key)
        if self.idle is not None and self.running <= self.idle_at and not self.queue and not self.idle.done():
            self.idle.set_result(None)

    async def wait_idle(self, still_running: int = 0) -> None:
        """Wait until no message waits and at most ``still_running`` run (the caller's own)."""
        if self.running > still_running or self.queue:
            self.idle_at = still_running
            self.idle = asyncio.get_running_loop().create_future()
            await self.idle

    def take_next(self) -> Envelope | None:
        """For a worker that finished a message: the next queued one it may run, entered."""
        if self.queue and self.running < self.max_concurrency and not self.unbegun and not self.paused:
            envelope = self.queue.popleft()
            self.enter(envelope.key)
            return envelope
        return None

    def wake(self) -> None:
        """Start workers for queued messages that may run now."""
        queue = self.queue
        while queue and self.running < self.max_concurrency and not self.paused:
            self.start(queue.popleft())

    def submit(self, envelope: Envelope) -> None:
        """Start ``envelope`` now if the mailbox allows, else queue it."""
        if self.batched and envelope.endpoint in self.batched:
            _batching.join(self, envelope)
        elif self.can_start(envelope.chain):
            self.start(envelope)
        else:
            self.enqueue(envelope)

    def enqueue(self, envelope: Envelope) -> None:
        """Put ``envelope`` at the back of the queue."""
        queue = self.queue
        queue.append(envelope)
        self.queued_peak = max(self.queued_peak, len(queue))

    def start(self, envelope: Envelope) -> None:
        """Run ``envelope`` in a new worker task, which then drains the queue."""
        self.enter(envelope.key)
        self.unbegun += 1
        task = self.node.loop.create_task(self.work(envelope))
        envelope.task = task
        self.tasks.add(task)
        task.add_done_callback(functools.partial(self._never_began, envelope))

    def _never_began(self, envelope: Envelope, task: asyncio.Task[None]) -> None:
        """A worker cancelled before it ran a line (a stop, a failure): answer its message for it."""
        if task not in self.tasks:
            return  # it ran: work() took itself out of the tasks
        self.tasks.discard(task)
        self.unbegun -= 1
        self.leave(envelope.key)
        self.fail(envelope, self.interrupted(envelope.endpoint, by_caller=envelope.cancelled))

    def cancel(self, envelope: Envelope) -> None:
        """Drop ``envelope`` if it is queued, else cancel its handler if it runs."""
        if envelope.batch is not None:
            _batching.leave(self, envelope)
            return
        try:
            self.queue.remove(envelope)
        except ValueError:
            if envelope.task is not None and not envelope.cancelled:
                envelope.cancelled = True
                envelope.task.cancel()

    def open(self, endpoint: str, args: Any, kwargs: dict[str, Any]) -> Any:
        """Start the handler coroutine, or raise ``EndpointError`` (unknown, private, ill-bound)."""
        handler = self.endpoints.get(endpoint)
        if handler is None:
            if endpoint.startswith("_"):
                raise EndpointError(f"{endpoint!r} of {self.label} is private: endpoints are public async methods")
            known = ", ".join(sorted([*self.endpoints, *self.batched])) or "none"
            raise EndpointError(f"{self.label} has no endpoint {endpoint!r} (endpoints: {known})")
        try:
            return handler(self.instance, *args, **kwargs)
        except TypeError as exc:
            raise EndpointError(f"bad arguments for {endpoint!r} of {self.label}: {exc}") from None

    async def work(self, envelope: Envelope | None) -> None:
        """A mailbox worker: handle ``envelope``, then queued messages while the mailbox allows.

        Consecutive messages run in this one task, so handlers that never suspend
        cost no task creation and no loop iteration each.
        """
        task = asyncio.current_task()
        assert task is not None
        self.unbegun -= 1
        if not self.unbegun:
            self.wake()  # messages that queued behind the workers started before this one
        try:
            while envelope is not None:
                envelope.task = task
                try:
                    if envelope.runs is None:
                        await self._handle(envelope)
                    else:
                        await _batching.run(self, envelope, envelope.runs)
                finally:
                    if envelope.cancelled:
                        task.uncancel()  # that cancellation was the message's, not the worker's
                    envelope.task = None
                    self.leave(envelope.key)
                envelope = self.take_next()
        finally:
            self.tasks.discard(task)

    async def _handle(self, envelope: Envelope) -> None:
        token = current_call.set(CallContext(self, envelope.key, envelope.chain, envelope.endpoint))
        deadline_token = inherited_deadline.set(envelope.deadline)
        timeout = None if envelope.deadline is None else asyncio.timeout_at(envelope.deadline)
        try:
            coroutine = self.open(envelope.endpoint, envelope.args, envelope.kwargs)
            if timeout is None:
                result = await coroutine
            else:
                async with timeout:
                    result = await coroutine
        except asyncio.CancelledError:
            self.fail(envelope, self.interrupted(envelope.endpoint, by_caller=envelope.cancelled))
            if not envelope.cancelled:
                raise  # the worker itself is cancelled (the actor is stopping)
        except EndpointError as exc:
            self.fail(envelope, exc)
        except TimeoutError as exc:
            if timeout is not None and timeout.expired():
                self.fail(envelope, TimeoutError(f"{envelope.endpoint!r} of {self.label} ran past its deadline"))
            else:
                self.fail(envelope, exc, HANDLER)
        except Exception as exc:  # noqa: BLE001 - any handler error goes back to the caller
            self.fail(envelope, exc, HANDLER)
            self.check_fatal(exc)
        else:
            if envelope.respond is not None:
                envelope.respond(True, result)
        finally:
            current_call.reset(token)
            inherited_deadline.reset(deadline_token)

    def check_fatal(self, exc: BaseException) -> None:
        """If a handler's ``exc`` is one its class declares fatal, the actor has failed.

        Its queued and running calls fail at once with ``ActorStoppedError``
        (the handler that raised answers its own caller); messages that arrive
        from now on wait for the next instance. The node's supervisor takes over.
        """
        if self.fatal and isinstance(exc, self.fatal) and self.failure is None and not self.stopping:
            self.failure = exc
            self.paused = True  # nothing more starts on the failed instance; later messages wait for the next
            cause = describe(exc)
            self.fail_queued(
                lambda endpoint: ActorStoppedError(f"{self.label} failed ({cause}) before handling {endpoint!r}")
            )
            self.node.actor_failed(self, exc, self.cancel_running(keep=asyncio.current_task()))

    def interrupted(self, endpoint: str, *, by_caller: bool) -> ActorStoppedError:
        """The error for a call whose handler was cancelled: by its caller, or because the actor stopped or failed."""
        if by_caller:
            return ActorStoppedError(f"call to {endpoint!r} of {self.label} was cancelled")
        if self.failure is not None:
            cause = describe(self.failure)
            return ActorStoppedError(f"{self.label} failed ({cause}) while handling {endpoint!r}")
        return ActorStoppedError(f"{self.label} stopped while handling {endpoint!r}")

    def enter_inline(self, task: asyncio.Task[Any], key: int) -> None:
        """A caller's task runs a handler of this actor in place (a same-node call)."""
        self.enter(key)
        self.inline[task] = self.inline.get(task, 0) + 1

    def leave_inline(self, task: asyncio.Task[Any], key: int) -> None:
        """The handler the caller's ``task`` ran in place is done."""
        depth = self.inline[task] - 1
        if depth:
            self.inline[task] = depth
        else:
            del self.inline[task]
            self.evicted.discard(task)
        self.leave(key)

    def cancel_running(self, keep: asyncio.Task[Any] | None = None) -> list[asyncio.Task[Any]]:
        """Cancel every handler running now (workers and inline callers), but ``keep``; return their tasks."""
        tasks: list[asyncio.Task[Any]] = [task for task in self.tasks if task is not keep]
        for task in tasks:
            task.cancel()
        for task in self.inline:
            if task is not keep and task not in self.evicted:
                self.evicted.add(task)
                task.cancel()
        return tasks

    def fail_queued(self, error: Callable[[str], BaseException]) -> None:
        """Answer every message waiting in the queue, and every open batch's calls, with ``error(endpoint)``."""
        while self.queue:
            envelope = self.queue.popleft()
            self.fail(envelope, error(envelope.endpoint))
        for batch in list(self.batches.values()):
            _batching.close(self, batch)
            _batching.answer_all(self, list(batch.members), False, (error(batch.endpoint), RUNTIME))

    def fail(self, envelope: Envelope, exc: BaseException, origin: int = RUNTIME) -> None:
        """Answer ``envelope`` with an error, or log it if nobody waits (a tell)."""
        if envelope.runs is not None:  # a batch not run: each of its calls gets the error
            batch, envelope.runs = envelope.runs, None
            _batching.close(self, batch)
            _batching.answer_all(self, list(batch.members), False, (exc, origin))
            return
        if is_refusal(exc, origin):
            self.node.log.warning("message refused", actor=self.label, endpoint=envelope.endpoint, error=describe(exc))
        if envelope.respond is not None:
            envelope.respond(False, (exc, origin))
        elif not is_refusal(exc, origin):
            log_tell_failure(self.node.log, self.label, envelope, exc, origin)
