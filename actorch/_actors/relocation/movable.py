"""Refs to relocatable actors: they follow their actor to the node it moved to.

An actor spawned with ``Restart(relocate=True)`` is reached through a
:class:`MovableRef`. Besides where the actor lives now (rank and id, as any
ref), it knows where the actor was first started, its *origin*: the identity
under which rank 0's relocator tracks it. A call goes straight to the home the
ref knows, as any call does. Only when this node counts that home lost does the
ref ask the relocator where the actor lives now (waiting while it moves) and
go there: a call in flight when the node died fails with ``NodeLostError``,
the next one reaches the new home. Calls and tells made meanwhile wait in the
ref, in order, and leave in that order once it knows the new home. Plain
actors keep plain ``ActorRef`` objects, so their calls never pay for this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from actorch._actors.actor import Actor, endpoints_of
from actorch._actors.ref import ActorRef, resolve_class
from actorch._actors.restart import ActorExit
from actorch._actors.system_endpoints import RelocatorEndpoints, ServiceEndpoints, system_call
from actorch._base.codec import current_context, register_extension
from actorch._base.deadline import current_deadline
from actorch._base.errors import ActorStoppedError, NodeLostError, SystemClosedError, describe
from actorch._base.names import actor_label
from actorch._engine.endpoints import check_call, endpoint_name
from actorch._engine.message import current_call
from actorch._engine.streaming import Stream, StreamRequest
from actorch._engine.system_ids import RELOCATOR_ID, SERVICE_ID

if TYPE_CHECKING:
    from actorch._engine.caller import Caller

__all__ = ["MovableRef", "Origin", "exit_error", "movable_ref"]

A = TypeVar("A", bound=Actor)

Origin = tuple[int, int]
"""Where a relocatable actor was first started, ``(rank, actor id)``: its identity wherever it moves."""

_RELOCATOR_LABEL = actor_label(None, "Relocator", RELOCATOR_ID, 0)
_moves: set[asyncio.Task[None]] = set()  # refs learning their actor's new home

Send = Callable[[BaseException | None], None]
"""A message waiting in a ref for its actor's new home: sends it there, or fails it with the error given."""


class MovableRef(ActorRef[A]):
    """A ref to a relocatable actor: the same API as ``ActorRef``, and it follows the actor when it moves.

    Two refs to one relocatable actor compare equal wherever it lives.
    """

    __slots__ = ("_origin", "_waiting")

    _origin: Origin
    _waiting: list[Send] | None  # messages waiting, in order, while this ref learns its actor's new home

    def __init__(
        self, caller: Caller, rank: int, actor_id: int, name: str | None, class_path: str, origin: Origin
    ) -> None:
        super().__init__(caller, rank, actor_id, name, class_path)
        self._origin = (origin[0], origin[1])
        self._waiting = None

    @property
    def origin(self) -> Origin:
        """Where the actor was first started, ``(rank, actor id)``: its identity wherever it moves."""
        return self._origin

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MovableRef):
            return self._origin == other._origin
        return NotImplemented if not isinstance(other, ActorRef) else False

    def __hash__(self) -> int:
        return hash(self._origin)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._rank, self._actor_id, self._name, self._class_path, self._origin))

    def call(self, method: Any, /, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
        """Call an endpoint, as ``ActorRef.call``; if this node counts the actor's node lost, at its new home."""
        endpoint = method if type(method) is str else endpoint_name(method)
        deadline = current_deadline()
        if self._rank not in self._caller.lost and self._waiting is None:
            return self._caller.call(self._rank, self._actor_id, endpoint, args, kwargs, self._label, deadline)
        sent: asyncio.Future[Any] = self._caller.loop.create_future()

        def send(error: BaseException | None) -> None:
            if sent.cancelled():
                return
            if error is not None:
                sent.set_exception(error)
                return
            try:
                call = self._caller.call(self._rank, self._actor_id, endpoint, args, kwargs, self._label, deadline)
            except Exception as exc:  # noqa: BLE001 - the caller's error, raised where it awaits
                sent.set_exception(exc)
            else:
                sent.set_result(call)

        self._wait_for_home(send)
        return _call_when_sent(sent)

    def stream(self, method: Any, /, *args: Any, **kwargs: Any) -> Stream[Any]:
        """Consume a streaming endpoint, as ``ActorRef.stream``; it opens at the actor's home when it opens."""
        endpoint = method if type(method) is str else endpoint_name(method)
        context = current_call.get()
        chain, device = (context.child_chain(), context.device) if context is not None else ((), None)
        request = StreamRequest(
            self._rank, self._actor_id, endpoint, args, kwargs, self._label, current_deadline(), chain, device
        )
        return Stream(_FollowingStreams(self), request)  # type: ignore[arg-type]  # its loop and open() are all a stream uses

    def tell(self, method: Any, /, *args: Any, **kwargs: Any) -> None:
        """Send a message without waiting, as ``ActorRef.tell``; to the actor's new home if its node was lost."""
        if self._rank not in self._caller.lost and self._waiting is None:
            super().tell(method, *args, **kwargs)
            return
        endpoint = method if type(method) is str else endpoint_name(method)
        cls = resolve_class(self._class_path)
        if cls is not None:
            check_call(endpoints_of(cls), endpoint, args, kwargs, self._label, cls)
        # The sender may change its tensors at once: the message keeps a copy of its own while it waits.
        kept_args, kept_kwargs = _private_copy(self._caller, [args, kwargs])

        def send(error: BaseException | None) -> None:
            try:
                if error is not None:
                    raise error
                ActorRef.tell(self, endpoint, *kept_args, **kept_kwargs)
            except Exception as exc:  # noqa: BLE001 - a tell has nobody to raise to: it is logged, as a failed tell is
                self._caller.log.warning("tell dropped", actor=self._label, endpoint=endpoint, error=describe(exc))

        self._wait_for_home(send)

    async def wait_stopped(self) -> ActorExit:
        """Wait until the actor has stopped for good, as ``ActorRef.wait_stopped``: a relocation is not a stop."""
        deadline = current_deadline()
        while True:
            if self._rank in self._caller.lost:
                ended = await self._ask(deadline)
                if ended is not None:
                    return ended
                continue
            try:
                exit_ = await system_call(
                    self._caller,
                    self._rank,
                    SERVICE_ID,
                    self._label,
                    deadline,
                    ServiceEndpoints.wait_stopped,
                    self._actor_id,
                )
            except NodeLostError:
                continue  # its node was lost: ask where it went
            except ActorStoppedError as exc:  # the node left the system: its actors stopped first
                return ActorExit("node_left", str(exc))
            return exit_

    async def stop(self) -> None:
        """Stop the actor, as ``ActorRef.stop``; wherever it moved (nothing to do if it was not relocated)."""
        deadline = current_deadline()
        while self._rank in self._caller.lost:
            if await self._ask(deadline) is not None:
                return  # it ended with its node: nothing is left to stop
        await super().stop()

    def _wait_for_home(self, send: Send) -> None:
        """Queue ``send`` until this ref knows its actor's new home; the first one starts learning it."""
        if self._waiting is None:
            self._waiting = []
            task = self._caller.loop.create_task(self._learn_home())
            _moves.add(task)
            task.add_done_callback(_moves.discard)
        self._waiting.append(send)

    async def _learn_home(self) -> None:
        """Follow the actor (within the relocator's bound), then send what waited, in order, or fail it."""
        error: BaseException | None = None
        try:
            while self._rank in self._caller.lost:
                await self._follow(None)
        except Exception as exc:  # noqa: BLE001 - each waiting message gets it
            error = exc
        waiting, self._waiting = self._waiting or [], None
        for send in waiting:
            send(error)

    async def _keep_snapshot(self, state: Any) -> bool:
        """Send ``state`` to the relocator as this actor's last snapshot (``Actor.save_snapshot``)."""
        if self._caller.transport.route(0) is None:  # rank 0 shares this process: it must not share the tensors
            state = _private_copy(self._caller, state)
        await system_call(
            self._caller,
            0,
            RELOCATOR_ID,
            _RELOCATOR_LABEL,
            current_deadline(),
            RelocatorEndpoints.keep,
            self._origin,
            self._rank,
            state,
            self._name,
        )
        return True

    async def _follow(self, deadline: float | None) -> None:
        """Learn the actor's home from the relocator (it waits while the actor moves); raise if it has none."""
        ended = await self._ask(deadline)
        if ended is not None:
            raise exit_error(ended, self._label)

    async def _ask(self, deadline: float | None) -> ActorExit | None:
        """Ask the relocator where the actor lives now and go there; how it ended if it lives nowhere."""
        stale = self._rank
        try:
            found = await system_call(
                self._caller, 0, RELOCATOR_ID, _RELOCATOR_LABEL, deadline, RelocatorEndpoints.home, self._origin, stale
            )
        except NodeLostError:
            if 0 not in self._caller.lost:
                raise
            return ActorExit("node_lost", f"node {stale} was lost, and so was rank 0, which relocates actors")
        if isinstance(found, ActorExit):
            return found
        if self._rank == stale:  # not moved meanwhile by another call's answer
            self._move_to(found[0], found[1])
        return None

    def _move_to(self, rank: int, actor_id: int) -> None:
        self._rank = rank
        self._actor_id = actor_id
        short = self._class_path.rpartition(":")[2] or self._class_path
        self._label = actor_label(self._name, short, actor_id, rank)


async def _call_when_sent(sent: asyncio.Future[Any]) -> Any:
    """Await a call that waited in its ref for the actor's new home: once sent, its outcome."""
    try:
        call = await sent
    except asyncio.CancelledError:
        if sent.done() and not sent.cancelled() and sent.exception() is None:
            _abandon(sent.result())
        raise
    return await call


def _abandon(call: Any) -> None:
    """Drop a call sent for a caller that gave up: cancel it (a same-node one never started)."""
    if asyncio.iscoroutine(call):
        call.close()
    else:
        call.cancel()


class _FollowingStreams:
    """What a stream of a movable ref opens through: the node's streams, at the actor's home when it opens."""

    def __init__(self, ref: MovableRef[Any]) -> None:
        self._ref = ref
        self._streams = ref._caller.streams
        self.loop = self._streams.loop

    async def open(self, stream: Stream[Any], opening: StreamRequest, window: int) -> Any:
        ref = self._ref
        if opening.rank in ref._caller.lost:
            while ref._rank in ref._caller.lost:
                await ref._follow(opening.deadline)
            opening = opening._replace(rank=ref._rank, actor_id=ref._actor_id, label=ref._label)
        return await self._streams.open(stream, opening, window)


def _private_copy(caller: Caller, value: Any) -> Any:
    """``value`` with its tensors copied and its refs rebuilt, as a message would carry it."""
    body, tensors = caller.codec.encode(value, copy_tensors=True)
    return caller.codec.decode(body, tensors, caller)


def exit_error(ended: ActorExit, label: str) -> ActorStoppedError | NodeLostError:
    """The error a call to a relocatable actor that ``ended`` gets: lost with its node, or stopped."""
    if ended.reason == "node_lost":
        return NodeLostError(f"{label}: {ended.error}")
    return ActorStoppedError(f"{label} has stopped ({ended.reason}{f': {ended.error}' if ended.error else ''})")


def movable_ref(
    caller: Caller, rank: int, actor_id: int, name: str | None, class_path: str, origin: Origin
) -> MovableRef[Any]:
    """A ref to relocatable actor ``origin``, now actor ``actor_id`` on ``rank``, sending through ``caller``."""
    return MovableRef._create(caller, rank, actor_id, name, class_path, origin)


def _rebuild(rank: int, actor_id: int, name: str | None, class_path: str, origin: Origin) -> MovableRef[Any]:
    caller = current_context()
    if caller is None:
        raise SystemClosedError("an ActorRef can only be unpickled by actorch while it decodes a message")
    return movable_ref(caller, rank, actor_id, name, class_path, origin)


def _encode(ref: MovableRef[Any]) -> list[Any]:
    return [ref._rank, ref._actor_id, ref._name, ref._class_path, ref._origin[0], ref._origin[1]]


def _decode(data: list[Any], caller: Any) -> MovableRef[Any]:
    return movable_ref(caller, data[0], data[1], data[2], data[3], (data[4], data[5]))


register_extension(MovableRef, None, _encode, _decode)
