"""One hosted actor's mailbox: who may run now, who waits, and re-entrant calls.

A ``Cell`` runs at most ``max_concurrency`` messages at once, starting them in
arrival order. A call whose chain of callers contains a call the actor is
handling right now (A → B → A) is re-entrant: it runs at once instead of
waiting behind the call it came from, which would never finish. Calls to a
batched endpoint join the open run of that endpoint (see ``batching``); the run
is one message in the mailbox. A cell is paused while its actor is being
restarted: messages wait in the queue for the new instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from actorch._base.deadline import PastDeadlineError, inherited_deadline, within
from actorch._base.devices import on_device
from actorch._base.errors import ActorStoppedError, EndpointError, describe
from actorch._engine.batching import Batched, Batcher
from actorch._engine.endpoints import Endpoint, is_streaming, unknown_endpoint, wrong_verb
from actorch._engine.flow import FlowControl
from actorch._engine.inline import InlineCalls
from actorch._engine.instruments import Instruments
from actorch._engine.message import CallContext, ItemRefused, Message, Origin, Outlet, Reply, current_call
from actorch._engine.metrics import EndpointStats
from actorch._engine.replies import TellDone, log_heard_failure
from actorch._engine.waits import MAX_CALLERS
from actorch._engine.wire import is_refusal
from actorch._transport.autograd import NO_CONTEXT, bound
from actorch._transport.base import PORT_HOLD

if TYPE_CHECKING:
    import torch

__all__ = ["CANCEL_WAIT", "WORK_SLICE", "Cell", "FailureListener"]

CANCEL_WAIT = 1.0
"""Seconds to wait for cancelled handlers to end before going on without them."""

WORK_SLICE = PORT_HOLD
"""Seconds a worker runs queued messages back to back before it lets the loop run (replies leave, others start)."""
WORK_SLICE_NS = int(WORK_SLICE * 1e9)

FailureListener = Callable[["Cell", BaseException, list[asyncio.Task[Any]]], None]
"""Called with a cell, the fatal error one of its handlers raised, and the handlers that interrupted."""


class Cell:
    """A hosted actor: its instance, endpoints, mailbox and counters."""

    __slots__ = (
        "_on_fatal",
        "active",
        "actor_id",
        "batched",
        "batcher",
        "device",
        "endpoints",
        "failure",
        "fatal",
        "handled",
        "idle",
        "idle_at",
        "inline",
        "instance",
        "instruments",
        "label",
        "log",
        "loop",
        "max_concurrency",
        "metrics",
        "name",
        "new_key",
        "node",
        "paused",
        "producing",
        "queue",
        "queued_peak",
        "restarts",
        "running",
        "stopping",
        "streaming",
        "tasks",
        "tell_replies",
        "unbegun",
    )

    def __init__(
        self,
        actor_id: int,
        instance: object,
        endpoints: Mapping[str, Endpoint],
        *,
        label: str,
        name: str | None,
        max_concurrency: int,
        loop: asyncio.AbstractEventLoop,
        log: Any,
        new_key: Callable[[], int],
        on_fatal: FailureListener,
        node: int,
        instruments: Instruments,
        device: torch.device | None = None,
    ) -> None:
        self.actor_id = actor_id
        self.node = node  # the rank of the node hosting the actor
        self.device = device  # the actor's accelerator device (handlers run with it current); None: the CPU
        self.instance = instance  # the host puts a new instance here when it restarts the actor
        self.endpoints = {name: handler for name, handler in endpoints.items() if not isinstance(handler, Batched)}
        self.batched = {name: handler for name, handler in endpoints.items() if isinstance(handler, Batched)}
        self.batcher = Batcher(self, self.batched) if self.batched else None
        self.streaming = frozenset(name for name, handler in self.endpoints.items() if is_streaming(handler))
        self.name = name
        self.label = label
        self.max_concurrency = max_concurrency
        self.loop = loop
        self.log = log
        self.new_key = new_key
        self._on_fatal = on_fatal
        self.running = 0
        self.unbegun = 0  # worker tasks created whose first message has not begun yet
        self.handled = 0
        self.instruments = instruments  # what observes its node's messages
        self.metrics: dict[str, EndpointStats] = {}  # by endpoint, what the metrics instrument counts (``metrics``)
        self.queue: deque[Message] = deque()
        self.queued_peak = 0
        # running messages by key: what each serves (a message, or the context of one run in its caller's task)
        self.active: dict[int, Message | CallContext | None] = {}
        self.stopping = False
        self.paused = False  # while the actor restarts: nothing starts, messages wait
        self.failure: BaseException | None = None  # the fatal error being recovered from
        self.fatal: tuple[type[BaseException], ...] = getattr(type(instance), "fatal_errors", ())
        self.restarts = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.inline = InlineCalls()
        self.idle: asyncio.Future[None] | None = None
        self.idle_at = 0
        self.tell_replies: dict[int | None, Reply] = {}  # one per node that tells this actor (None: its own)
        self.producing: set[Outlet] = set()  # streams whose generator runs now

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
        if self.batcher is not None:
            counts["batched_calls"] = self.batcher.calls
        return counts

    def waits(self, now: int) -> dict[str, Any]:
        """What this actor runs now and what waits in its mailbox, as plain data (``now``: ``perf_counter_ns()``).

        ``handlers``: each handler running, oldest first: its endpoint, seconds
        since it began (None: its worker has not begun), its key and its
        caller's (see ``waits``). ``queued_seconds``: how long the oldest queued
        message has waited (None: none waits). ``queued_callers``: the handlers
        whose calls wait in the queue. Safe to call from another thread: it
        only copies.
        """
        running = []
        for key, serving in list(self.active.items()):
            if serving is None:
                continue
            chain = serving.chain
            running.append(
                {
                    "endpoint": serving.endpoint,
                    "seconds": (now - serving.started) / 1e9 if serving.started else None,
                    "key": key,
                    "caller": chain[-1] if chain else None,
                }
            )
        running.sort(key=lambda handler: -float(handler["seconds"] or 0.0))
        queued = list(self.queue)
        callers = {message.chain[-1] for message in queued if message.chain}
        oldest = min((message.queued_at for message in queued if message.queued_at), default=0)
        return {
            "handlers": running,
            "queued_seconds": (now - oldest) / 1e9 if oldest else None,
            "queued_callers": sorted(callers)[:MAX_CALLERS],
        }

    # ------------------------------------------------------------------ who runs

    def is_reentrant(self, chain: tuple[int, ...]) -> bool:
        """Whether a call with this chain comes back to a call this actor is handling."""
        return bool(chain) and bool(self.active) and not self.active.keys().isdisjoint(chain)

    def can_start(self, chain: tuple[int, ...]) -> bool:
        """Whether a new message may start now rather than wait in the queue.

        Not while a worker started earlier has yet to begin its message: messages
        start in the order they arrived, also when several may run at once.
        """
        if self.paused:
            return False
        free = self.running < self.max_concurrency and not self.queue and not self.unbegun
        return free or self.is_reentrant(chain)

    def enter(self, key: int, serving: Message | CallContext | None = None) -> None:
        """Count a message as running: ``serving`` is its message, or the context of a handler run in place."""
        self.running += 1
        self.active[key] = serving

    def leave(self, key: int) -> None:
        """Count a message as done (the caller then takes or starts the next ones)."""
        self.running -= 1
        self.handled += 1
        self.active.pop(key, None)
        if self.idle is not None and self.running <= self.idle_at and not self.queue and not self.idle.done():
            self.idle.set_result(None)

    async def wait_idle(self, still_running: int = 0) -> None:
        """Wait until no message waits and at most ``still_running`` run (the caller's own)."""
        if self.running > still_running or self.queue:
            self.idle_at = still_running
            self.idle = self.loop.create_future()
            await self.idle

    def take_next(self) -> Message | None:
        """For a worker that finished a message: the next queued one it may run, entered."""
        if self.queue and self.running < self.max_concurrency and not self.unbegun and not self.paused:
            message = self.queue.popleft()
            self.enter(message.key, message)
            return message
        return None

    def wake(self) -> None:
        """Start workers for queued messages that may run now."""
        queue = self.queue
        while queue and self.running < self.max_concurrency and not self.paused:
            self.start(queue.popleft())

    # ------------------------------------------------------------------ messages in

    def tell_reply(self, src: int | None, flow: FlowControl, log: Any) -> Reply:
        """What ends the tells from node ``src`` (None: this one) to this actor: one shared by all of them."""
        reply = self.tell_replies.get(src)
        if reply is None:
            reply = self.tell_replies[src] = TellDone(flow, log, src, self.actor_id, self.label)
        return reply

    def deliver(self, message: Message) -> None:
        """Take a message for this actor, or refuse it if the actor is stopping."""
        if self.stopping:
            self.fail(message, ActorStoppedError(f"{self.label} is stopping; {message.endpoint!r} refused"))
        elif self.batcher is not None and message.endpoint in self.batched and message.outlet is None:
            self.batcher.join(message)
        else:
            self.schedule(message)

    def schedule(self, message: Message) -> None:
        """Start ``message`` now if the mailbox allows, else put it at the back of the queue."""
        if self.can_start(message.chain):
            self.start(message)
        else:
            queue = self.queue
            message.queued_at = perf_counter_ns()  # only a message that waits pays for the clock: its queued age
            queue.append(message)
            if len(queue) > self.queued_peak:  # noqa: PLR1730 - a compare, not a call, for every queued message
                self.queued_peak = len(queue)

    def run_now(self, message: Message) -> None:
        """Start a queued ``message`` at once, ahead of its turn (it serves a call the actor is handling)."""
        with contextlib.suppress(ValueError):  # not queued: it started already
            self.queue.remove(message)
            self.start(message)

    def start(self, message: Message) -> None:
        """Run ``message`` in a new worker task, which then drains the queue."""
        self.enter(message.key, message)
        self.unbegun += 1
        task = self.loop.create_task(self.work(message))
        message.task = task
        self.tasks.add(task)
        task.add_done_callback(functools.partial(self._never_began, message))

    def track(self, task: asyncio.Task[None]) -> None:
        """Count ``task`` among the actor's handlers, so that a stop or a shutdown cancels it too."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _never_began(self, message: Message, task: asyncio.Task[None]) -> None:
        """A worker cancelled before it ran a line (a stop, a failure): answer its message for it."""
        if task not in self.tasks:
            return  # it ran: work() took itself out of the tasks
        self.tasks.discard(task)
        self.unbegun -= 1
        self.leave(message.key)
        self.fail(message, self.interrupted(message.endpoint, by_caller=message.cancelled))

    def cancel(self, message: Message) -> None:
        """Drop ``message`` if it is queued, else cancel its handler if it runs."""
        if message.batch is not None:
            assert self.batcher is not None
            self.batcher.leave(message)
            return
        try:
            self.queue.remove(message)
        except ValueError:
            if message.task is not None and not message.cancelled:
                message.cancelled = True
                message.task.cancel()

    # ------------------------------------------------------------------ handling

    def open(
        self,
        endpoint: str,
        args: Any,
        kwargs: Any,
        autograd: int = NO_CONTEXT,
        deadline: float | None = None,
        outlet: Outlet | None = None,
        carried: dict[str, Any] | None = None,
    ) -> Any:
        """Start the handler (in its call's autograd context, within its deadline), or raise ``EndpointError``.

        With ``outlet`` the message is a stream: the endpoint must be one that
        yields, and the handler runs its generator into the outlet. The
        instruments' ``serving`` hook may wrap it (given ``carried``, what
        the message carried for them).
        """
        handler = self.endpoints.get(endpoint)
        if handler is None:
            if endpoint in self.batched and outlet is not None:
                raise EndpointError(wrong_verb(endpoint, self.label, streaming=False))
            raise EndpointError(
                unknown_endpoint(endpoint, self.label, [*self.endpoints, *self.batched], type(self.instance))
            )
        if (endpoint in self.streaming) != (outlet is not None):
            raise EndpointError(wrong_verb(endpoint, self.label, streaming=outlet is None))
        try:
            coroutine = handler(self.instance, *args, **kwargs)
        except TypeError as exc:
            raise EndpointError(f"bad arguments for {endpoint!r} of {self.label}: {exc}") from None
        if outlet is not None:
            coroutine = outlet.pump(coroutine, self.producing)  # type: ignore[arg-type]  # a stream's: a generator
        if self.device is not None:
            coroutine = on_device(coroutine, self.device)
        if autograd != NO_CONTEXT:
            coroutine = bound(coroutine, autograd)
        if deadline is not None:
            coroutine = within(coroutine, deadline)
        if self.instruments.serving is not None:
            coroutine = self.instruments.serving(self, endpoint, coroutine, carried)
        return coroutine

    async def work(self, message: Message | None) -> None:  # noqa: PLR0912 - the hot loop, kept in one frame
        """A mailbox worker: handle ``message``, then queued messages while the mailbox allows.

        Consecutive messages run in this one task, so handlers that never suspend
        cost no task creation and no loop iteration each; after ``WORK_SLICE``
        of them it lets the loop run once, so replies leave as they are ready.
        """
        task = asyncio.current_task()
        assert task is not None
        instruments = self.instruments  # the node's: installed and removed in place
        self.unbegun -= 1
        if not self.unbegun:
            self.wake()  # messages that queued behind the workers started before this one
        try:
            slice_end = perf_counter_ns() + WORK_SLICE_NS
            while message is not None:
                message.task = task
                message.started = perf_counter_ns()
                failed = False
                count = 1
                try:
                    if message.runs is not None:
                        assert self.batcher is not None
                        count = await self.batcher.run(message, message.runs)
                    else:  # in this frame: no coroutine of its own per message
                        # Not reset after: the worker's context is its own, and the next message sets both anew.
                        current_call.set(
                            CallContext(
                                self.label, message.key, message.chain, message.endpoint, self.device, self.node
                            )
                        )
                        inherited_deadline.set(message.deadline)
                        try:
                            result = await self.open(
                                message.endpoint,
                                message.args,
                                message.kwargs,
                                message.autograd,
                                message.deadline,
                                message.outlet,
                                message.carried,
                            )
                        except BaseException as exc:  # noqa: BLE001 - sorted out (and re-raised if need be) there
                            failed = True
                            self._handler_failed(message, exc)
                        else:
                            if message.reply is not None:
                                message.reply.result(message, result)
                finally:
                    if message.cancelled:
                        task.uncancel()  # that cancellation was the message's, not the worker's
                    message.task = None
                    self.leave(message.key)
                    ended = perf_counter_ns()
                    if count:  # a batch run that ended before its method ran is no run
                        if message.queued_at and instruments.mailbox_wait is not None:
                            instruments.mailbox_wait(self, message)
                        if instruments.handled is not None:
                            instruments.handled(self, message, ended, failed, count)
                if self.queue and ended >= slice_end:
                    await asyncio.sleep(0)  # the loop sends the replies ready so far before the next message
                    slice_end = perf_counter_ns() + WORK_SLICE_NS
                message = self.take_next()
        finally:
            self.tasks.discard(task)

    def _handler_failed(self, message: Message, exc: BaseException) -> None:
        """Answer ``message``, whose handler raised ``exc``; re-raise what is the worker's own to end."""
        if isinstance(exc, asyncio.CancelledError):
            by_caller = message.cancelled and not (self.stopping and message.outlet is not None)
            self.fail(message, self.interrupted(message.endpoint, by_caller=by_caller))
            if not message.cancelled:
                raise exc  # the worker itself is cancelled (the actor is stopping)
        elif isinstance(exc, EndpointError):
            self.fail(message, exc)
        elif isinstance(exc, ItemRefused):  # a stream's item could not be sent: the runtime ends the stream
            self.fail(message, exc.error)
        elif isinstance(exc, PastDeadlineError):
            self.fail(message, TimeoutError(f"{message.endpoint!r} of {self.label} ran past its deadline"))
        elif isinstance(exc, Exception):  # any handler error goes back to the caller
            self.fail(message, exc, Origin.HANDLER)
            self.check_fatal(exc)
        else:
            raise exc  # KeyboardInterrupt, SystemExit: not the caller's to hear

    # ------------------------------------------------------------------ failure and stop

    def check_fatal(self, exc: BaseException) -> None:
        """If a handler's ``exc`` is one its class declares fatal, the actor has failed.

        Its queued and running calls fail at once with ``ActorStoppedError``
        (the handler that raised answers its own caller); messages that arrive
        from now on wait for the next instance. The failure listener takes over.
        """
        if self.fatal and isinstance(exc, self.fatal) and self.failure is None and not self.stopping:
            self.failure = exc
            self.paused = True  # nothing more starts on the failed instance; later messages wait for the next
            cause = describe(exc)
            self.fail_queued(
                lambda endpoint: ActorStoppedError(f"{self.label} failed ({cause}) before handling {endpoint!r}")
            )
            self._on_fatal(self, exc, self.cancel_running(keep=asyncio.current_task()))

    def resume(self, *, restarted: bool) -> None:
        """The actor's instance is in place again: start the messages that waited for it."""
        self.paused = False
        self.failure = None
        if restarted:
            self.restarts += 1
        self.wake()

    def interrupted(self, endpoint: str, *, by_caller: bool) -> ActorStoppedError:
        """The error for a call whose handler was cancelled: by its caller, or because the actor stopped or failed."""
        if by_caller:
            return ActorStoppedError(f"call to {endpoint!r} of {self.label} was cancelled")
        if self.failure is not None:
            cause = describe(self.failure)
            return ActorStoppedError(f"{self.label} failed ({cause}) while handling {endpoint!r}")
        return ActorStoppedError(f"{self.label} stopped while handling {endpoint!r}")

    def cancel_running(self, keep: asyncio.Task[Any] | None = None) -> list[asyncio.Task[Any]]:
        """Cancel every handler running now (workers and inline callers), but ``keep``; return their tasks."""
        tasks: list[asyncio.Task[Any]] = [task for task in self.tasks if task is not keep]
        for task in tasks:
            task.cancel()
        self.inline.evict(keep)
        return tasks

    def end_streams(self) -> None:
        """The actor is stopping: end its streams now, queued or running, rather than wait for them.

        A stream runs until its consumer leaves, so draining would wait out the
        whole grace. Their consumers get ``ActorStoppedError``; other queued
        messages still run.
        """
        for queued in [queued for queued in self.queue if queued.outlet is not None]:
            self.queue.remove(queued)
            self.fail(queued, ActorStoppedError(f"{self.label} is stopping; stream {queued.endpoint!r} refused"))
        for outlet in list(self.producing):
            running = outlet.message
            if running is not None and running.task is not None and not running.cancelled:
                running.cancelled = True  # the worker goes on with the queue; the reply says the actor stopped
                running.task.cancel()

    def fail_queued(self, error: Callable[[str], BaseException]) -> None:
        """Answer every message waiting in the queue, and every open batch's calls, with ``error(endpoint)``."""
        while self.queue:
            message = self.queue.popleft()
            self.fail(message, error(message.endpoint))
        if self.batcher is not None:
            self.batcher.fail_open(error)

    def fail(self, message: Message, exc: BaseException, origin: Origin = Origin.RUNTIME) -> None:
        """Answer ``message`` with an error, and log it as loud as nobody else hears it.

        A call's or a stream's caller hears the error: it is logged at debug
        level only. A refused tell is a warning; a tell whose handler raised is
        logged by its reply, as an error.
        """
        if message.runs is not None:  # a batch not run: each of its calls gets the error
            assert self.batcher is not None
            self.batcher.fail_unrun(message, exc, origin)
            return
        reply = message.reply
        if isinstance(reply, TellDone):
            if is_refusal(exc, origin):
                self.log.warning("message refused", actor=self.label, endpoint=message.endpoint, error=describe(exc))
        elif origin == Origin.HANDLER or is_refusal(exc, origin):
            log_heard_failure(self.log, self.label, message.endpoint, exc, origin)
        if reply is not None:
            reply.error(message, exc, origin)

    def refuse_all(self) -> None:
        """Refuse every message from now on: the actor is stopping or gone."""
        self.stopping = True
