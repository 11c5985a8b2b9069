"""Streams: an actor's async generator consumed with ``async for`` from any node, bounded by credits.

``ref.stream(Cls.gen, ...)`` returns a :class:`Stream`. Its first ``__anext__``
opens it: the producing actor gets one message whose handler runs ``gen`` into
an :class:`~actorch._engine.message.Outlet`, so under the actor's concurrency
rules a running stream is a message being handled. The consumer grants the
producer ``window`` credits and tops them up as it takes items, so neither end
holds more than ``window`` items. Items arrive in order and once each (the
transport keeps order per pair of nodes). Between actors of one node, items are
handed over as they are, without serialisation, like same-node calls.

The stream ends with the generator's end (``StopAsyncIteration``), its error
(a ``RemoteError``), ``ActorStoppedError`` or ``NodeLostError``. The consumer
leaving early (``aclose``, leaving ``async with``, a ``break`` that drops the
stream, a cancelled or timed-out ``__anext__``) closes the producer's generator
on its node.

The module is one piece past 600 lines because it holds one protocol: the
consumer's :class:`Stream`, its links (same node or remote), the producer's
outlet and the node's table of open streams agree on every step of it
(opening, credits, items, the end and an early close), and split across
modules each would restate the others' half.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from actorch._base.codec import Shared
from actorch._base.errors import (
    ActorStoppedError,
    NodeLostError,
    SerializationError,
    SystemClosedError,
    actor_stopped,
)
from actorch._engine.cell import Cell
from actorch._engine.message import ItemRefused, Message, Origin, Outlet, Reply
from actorch._engine.side import NodeSide, SideParts
from actorch._engine.wire import (
    CLOSE,
    END,
    ITEM,
    MORE,
    STREAM,
    encode_message,
    error_payload,
    handler_error,
    rebuild_error,
)
from actorch._transport.base import Port

if TYPE_CHECKING:
    from types import TracebackType

    import torch

    from actorch._engine.instruments import Outgoing

__all__ = ["DEFAULT_STREAM_WINDOW", "Stream", "StreamRequest", "Streams"]

T = TypeVar("T")

DEFAULT_STREAM_WINDOW = 16
"""Items a stream's producer may be ahead of its consumer, unless the stream sets its own (``with_window``)."""

_FINISHED = StopAsyncIteration()  # the end of a stream that ended well, or whose end was raised already


class StreamRequest(NamedTuple):
    """What a stream asks and of whom, with the consumer's context: all it needs to open."""

    rank: int
    actor_id: int
    endpoint: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    label: str
    deadline: float | None  # the consumer's, read where ``ref.stream`` was called
    chain: tuple[int, ...]  # the calls the consumer is serving (re-entrancy)
    device: torch.device | None  # where staged tensors of its items go: the consuming actor's device


class Stream(Generic[T]):
    """The consuming end of a stream: iterate it with ``async for``; it opens on the first item asked for.

    Made by ``ref.stream(...)``, never by users. Leaving it early stops the
    producer: use ``async with ref.stream(...) as items:`` or :meth:`aclose`
    to stop it at a known moment; a stream dropped after ``break`` is closed
    when it is collected (at once in CPython).
    """

    __slots__ = (
        "__weakref__",
        "_end",
        "_granted",
        "_items",
        "_link",
        "_opening",
        "_streams",
        "_unopened",
        "_waiter",
        "_window",
    )

    def __init__(self, streams: Streams, opening: StreamRequest) -> None:
        self._streams = streams
        self._opening = opening
        self._unopened = True
        self._window = DEFAULT_STREAM_WINDOW
        self._items: deque[T] = deque()
        self._granted = 0  # credits the producer holds that no item has used yet
        self._end: BaseException | None = None  # set when the stream ended: raised once the items are taken
        self._waiter: asyncio.Future[None] | None = None
        self._link: _Link | None = None  # the producer, once open

    def __repr__(self) -> str:
        state = "ended" if self._end is not None else "not open" if self._unopened else "open"
        return f"<Stream {self.endpoint!r} of {self.label} {state} window={self._window}>"

    def __del__(self) -> None:
        link = self._link
        if link is not None and self._end is None:
            with contextlib.suppress(RuntimeError):  # a closed loop: the node and its streams are gone already
                self._streams.loop.call_soon_threadsafe(link.close)

    @property
    def endpoint(self) -> str:
        """The streaming endpoint's name."""
        return self._opening.endpoint

    @property
    def label(self) -> str:
        """The producing actor, as logs and errors name it."""
        return self._opening.label

    @property
    def window(self) -> int:
        """Items the producer may be ahead of this consumer (its credits)."""
        return self._window

    def with_window(self, window: int) -> Stream[T]:
        """Set how many items the producer may be ahead of this consumer; return the stream.

        A larger window keeps a fast producer busy across network latency; a
        smaller one bounds the memory that unconsumed items take on both ends.
        Set it before the first item to bound the whole stream; a change later
        takes effect as credits are topped up.

        Raises:
            ValueError: ``window`` is not an int of at least 1.
        """
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"a stream's window is an int >= 1, not {window!r}")
        self._window = window
        if self._link is not None:
            self._top_up()
        return self

    # ------------------------------------------------------------------ consuming

    def __aiter__(self) -> Stream[T]:
        return self

    async def __anext__(self) -> T:
        """The next item; ``StopAsyncIteration`` at the end, or the error the stream ended with."""
        if self._items:
            return self._take()
        if self._unopened:
            try:
                await self._open()
            except asyncio.CancelledError:  # while waiting for room in the mailbox
                self._close()
                raise
            if self._items:
                return self._take()
        if self._end is not None:
            raise self._raise_end()
        waiter = self._waiter = self._streams.loop.create_future()
        try:
            await waiter
        except asyncio.CancelledError:
            self._close()  # the consumer gave up waiting (cancelled, a deadline): the producer stops
            raise
        finally:
            self._waiter = None
        if self._items:
            return self._take()
        raise self._raise_end()

    async def aclose(self) -> None:
        """Leave the stream: the producer's generator is closed on its node; later items are dropped."""
        self._close()

    async def __aenter__(self) -> Stream[T]:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close()

    # ------------------------------------------------------------------ from the producer

    def _arrived(self, item: T) -> None:
        """The producer sent ``item``."""
        if self._end is not None:
            return  # closed by the consumer: what was already on its way is dropped
        self._granted -= 1
        self._items.append(item)
        self._wake()

    def _ended(self, error: BaseException | None) -> None:
        """The producer's side ended the stream: well (None) or with ``error``."""
        if self._end is None:
            self._end = _FINISHED if error is None else error
            self._link = None
            self._wake()

    # ------------------------------------------------------------------ internals

    async def _open(self) -> None:
        self._unopened = False
        self._granted = self._window
        try:
            self._link = await self._streams.open(self, self._opening, self._window)
        except Exception as exc:  # noqa: BLE001 - raised where the items are asked for, like the stream's own errors
            self._end = exc
            await asyncio.sleep(0)  # it may have failed at once: a loop that retries must not starve the node

    def _take(self) -> T:
        item: T = self._items.popleft()
        if self._link is not None and self._granted + len(self._items) <= self._window // 2:
            self._top_up()
        return item

    def _top_up(self) -> None:
        """Grant the producer what brings its lead back to the window."""
        assert self._link is not None
        owed = self._window - self._granted - len(self._items)
        if owed > 0:
            self._granted += owed
            self._link.more(owed)

    def _raise_end(self) -> BaseException:
        end = self._end
        assert end is not None
        self._end = _FINISHED  # an error is raised once; then the stream is simply over
        return end

    def _close(self) -> None:
        self._unopened = False
        if self._end is None:
            self._end = _FINISHED
            link, self._link = self._link, None
            if link is not None:
                link.close()
        self._items.clear()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Link:
    """The consumer's line to its producer: grant credits, or close."""

    __slots__ = ()

    def more(self, count: int) -> None:
        """Grant the producer ``count`` credits."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the producer (once)."""
        raise NotImplementedError


def _settle(link: _LocalLink | _RemoteLink, error: BaseException | None = None, outcome: str | None = None) -> None:
    """The stream of ``link`` ended (with ``error``, or ``outcome``: ``closed``): its instruments hear it, once."""
    out, link.out = link.out, None
    if out is not None:
        link.side.instruments.settle(out, error, outcome)


# ---------------------------------------------------------------------- on this node


class _LocalLink(Outlet, _Link, Reply):
    """A stream between actors of one node: items pass as they are, credits and the end directly."""

    __slots__ = ("cell", "live", "opening", "out", "side", "stream")

    def __init__(self, side: Streams, stream: Stream[Any], opening: StreamRequest, window: int, cell: Cell) -> None:
        Outlet.__init__(self, side.loop, window)
        self.opening = opening
        self.side = side
        self.stream = weakref.ref(stream)  # a stream dropped by its consumer is collected, then closes its link
        self.live = True
        self.cell = cell
        self.out: Outgoing | None = None  # what its instruments see of it, if any observe it

    def put(self, item: Any) -> None:
        stream = self.stream()
        if stream is not None and self.live:
            stream._arrived(item.value if type(item) is Shared else item)  # a consumer here gets the value
            if self.side.instruments.stream_item is not None and self.message is not None:
                self.side.instruments.stream_item(self.message, self.sent, None, None)

    def close(self) -> None:
        if not self.live:
            return
        self.live = False
        _settle(self, outcome="closed")
        self.side.flow.release_local(self.opening.actor_id)
        if self.message is not None:
            self.cell.cancel(self.message)

    def result(self, message: Message, value: Any) -> None:
        self._end(None)

    def error(self, message: Message, exc: BaseException, origin: Origin) -> None:
        if origin == Origin.HANDLER:
            exc = handler_error(exc, self.opening.label, self.opening.endpoint)
        self._end(exc)

    def _end(self, error: BaseException | None) -> None:
        if not self.live:
            return
        self.live = False
        _settle(self, error)
        self.side.flow.release_local(self.opening.actor_id)
        stream = self.stream()
        if stream is not None:
            stream._ended(error)


# ---------------------------------------------------------------------- across nodes


class _RemoteLink(_Link):
    """The consuming end of a stream whose producer is on another node."""

    __slots__ = ("opening", "out", "side", "stream", "stream_id")

    def __init__(self, side: Streams, stream: Stream[Any], opening: StreamRequest, stream_id: int) -> None:
        self.opening = opening
        self.side = side
        self.stream = weakref.ref(stream)  # a stream dropped by its consumer is collected, then closes its link
        self.stream_id = stream_id
        self.out: Outgoing | None = None  # what its instruments see of it, if any observe it

    def more(self, count: int) -> None:
        self.side.send_control(self.opening.rank, [MORE, self.stream_id, count])

    def end(self, error: BaseException | None) -> None:
        """The stream ended on the producer's side, or its node was lost: tell the consumer, if still there."""
        _settle(self, error)
        stream = self.stream()
        if stream is not None:
            stream._ended(error)

    def close(self) -> None:
        _settle(self, outcome="closed")
        if self.side.forget(self):
            self.side.send_control(self.opening.rank, [CLOSE, self.stream_id])


class _RemoteOutlet(Outlet, Reply):
    """The producing end of a stream whose consumer is on another node: items and the end go on the wire."""

    __slots__ = ("side", "src", "stream_id")

    def __init__(self, side: Streams, src: int, stream_id: int, window: int) -> None:
        super().__init__(side.loop, window)
        self.side = side
        self.src = src
        self.stream_id = stream_id

    def origin(self) -> tuple[int, int, bool]:
        """The consuming node and its stream id."""
        return self.src, self.stream_id, True

    def put(self, item: Any) -> None:
        side = self.side
        try:
            body, tensors = encode_message(
                side.codec,
                item,
                side.max_message_size,
                "item {} of the stream of {!r} on node {}",
                self.sent,
                self.message.endpoint if self.message is not None else "?",
                side.rank,
                copy_tensors=True,
                route=side.transport.route(self.src),
            )
        except SerializationError as exc:  # MessageTooLargeError too
            raise ItemRefused(exc) from None
        wire = side.pack([ITEM, self.stream_id, body])
        side.transport.send(self.src, wire, tensors)
        if side.instruments.stream_item is not None and self.message is not None:
            side.instruments.stream_item(self.message, self.sent, wire, tensors)

    def result(self, message: Message, value: Any) -> None:
        if self.side.served(self):
            self.side.send_control(self.src, [END, self.stream_id, True, None])

    def error(self, message: Message, exc: BaseException, origin: Origin) -> None:
        if self.side.served(self):
            self.side.send_control(self.src, [END, self.stream_id, False, error_payload(exc, origin)])


class Streams(NodeSide):
    """This node's streams: those it consumes from other nodes' actors, and those its actors produce."""

    __slots__ = ("_next_id", "consuming", "producing", "streams_opened", "streams_served")

    def __init__(self, parts: SideParts, decode_context: object) -> None:
        super().__init__(parts, decode_context)
        self._next_id = 0
        self.consuming: dict[int, _RemoteLink] = {}
        self.producing: dict[tuple[int, int], tuple[Cell, Message]] = {}
        self.streams_opened = 0
        self.streams_served = 0

    def __repr__(self) -> str:
        return f"<Streams node {self.rank} consuming={len(self.consuming)} producing={len(self.producing)}>"

    def stream(self, request: StreamRequest) -> Stream[Any]:
        """A stream of ``request``, to be opened when it is first iterated."""
        return Stream(self, request)

    # ------------------------------------------------------------------ consuming

    async def open(self, stream: Stream[Any], opening: StreamRequest, window: int) -> _Link:
        """Open ``stream``: a slot of the actor's mailbox window, then the message that starts the producer."""
        if asyncio.events._get_running_loop() is not self.loop:
            raise RuntimeError(f"a stream of {opening.label} is consumed on its node's event loop, not another")
        out = None
        if self.instruments.outgoing:
            out = self.instruments.made("stream", opening.rank, opening.actor_id, opening.label, opening.endpoint)
        try:
            self.check_reachable("stream", opening.rank, opening.endpoint, opening.label)
            target = (opening.rank, opening.actor_id)
            if not self.flow.try_take(target):
                await self.wait_room("stream", target, opening.deadline, opening.endpoint, opening.label)
            try:
                self.check_reachable("stream", opening.rank, opening.endpoint, opening.label)
                self.streams_opened += 1
                if opening.rank == self.rank:
                    return self._open_local(stream, opening, window, out)
                return self._open_remote(stream, opening, window, out)
            except BaseException:
                self.flow.release(target)
                raise
        except BaseException as exc:
            if out is not None:
                self.instruments.settle(out, exc)
            raise

    def _open_local(self, stream: Stream[Any], opening: StreamRequest, window: int, out: Outgoing | None) -> _Link:
        cell = self.cells.get(opening.actor_id)
        if cell is None or cell.stopping:
            raise actor_stopped(f"stream {opening.endpoint!r}", opening.label)
        link = _LocalLink(self, stream, opening, window, cell)
        message = Message(
            opening.endpoint, opening.args, opening.kwargs, self.new_key(), opening.chain, opening.deadline, link
        )
        message.outlet, link.message = link, message
        if out is not None:
            link.out = out
            message.carried = out.carrier
            self.instruments.left(out)
        cell.deliver(message)
        return link

    def _open_remote(self, stream: Stream[Any], opening: StreamRequest, window: int, out: Outgoing | None) -> _Link:
        rank = opening.rank
        if opening.args or opening.kwargs:
            body, tensors = encode_message(
                self.codec,
                [opening.args, opening.kwargs],
                self.max_message_size,
                "stream of {!r} of {}",
                opening.endpoint,
                opening.label,
                route=self.transport.route(rank),
                arguments=True,
            )
        else:
            body, tensors = None, None
        remaining = None
        if opening.deadline is not None:
            remaining = opening.deadline - self.loop.time()
            if remaining <= 0:
                raise TimeoutError(f"deadline passed before streaming {opening.endpoint!r} of {opening.label}")
        self._next_id += 1
        link = _RemoteLink(self, stream, opening, self._next_id)
        self.consuming[link.stream_id] = link
        envelope = [STREAM, link.stream_id, opening.actor_id, opening.endpoint, remaining, opening.chain, body, window]
        if out is None:
            wire = self.pack(envelope)
        else:
            link.out = out
            wire = self.instruments.packed(out, envelope, self.pack, link.stream_id, body, tensors)
        self.transport.send(rank, wire, tensors)
        return link

    def forget(self, link: _RemoteLink) -> bool:
        """The consumer of ``link`` left or the stream ended: give back its mailbox slot; False if done already."""
        if self.consuming.pop(link.stream_id, None) is None:
            return False
        self.flow.release((link.opening.rank, link.opening.actor_id))
        return not self.closed and link.opening.rank not in self.lost

    def on_item(self, src: int, message: list[Any], tensors: list[Any]) -> None:
        """An item of a stream this node consumes."""
        _, stream_id, body = message
        link = self.consuming.get(stream_id)
        stream = link.stream() if link is not None else None
        if link is None or stream is None:
            self.codec.drop(body)  # the consumer left; items already on their way are dropped
            return
        try:
            item = self.codec.decode(body, tensors, self.decode_context, link.opening.device)
        except Exception as exc:  # noqa: BLE001 - an item we cannot read ends the stream, never hangs it
            self.log.warning("unreadable stream item", src=src, actor=link.opening.label, error=repr(exc))
            link.close()
            stream._ended(
                SerializationError(
                    f"an item of {link.opening.label}.{link.opening.endpoint} could not be read: {exc!r}"
                )
            )
            return
        stream._arrived(item)

    def on_end(self, src: int, message: list[Any]) -> None:
        """The end of a stream this node consumes: its generator finished, or the error it ended with."""
        _, stream_id, ok, payload = message
        link = self.consuming.get(stream_id)
        if link is None:
            return
        self.forget(link)
        if ok:
            link.end(None)
        elif payload[0] == Origin.GONE:
            link.end(actor_stopped(f"stream {link.opening.endpoint!r}", link.opening.label))
        else:
            link.end(rebuild_error(payload, link.opening.label, link.opening.endpoint))

    # ------------------------------------------------------------------ producing

    def on_open(self, src: int, message: list[Any], tensors: list[Any], port: Port | None) -> None:
        """A stream asked of an actor of this node: deliver its message, whose handler runs the generator."""
        carried = message.pop() if len(message) > 8 else None  # what the consumer's instruments carry
        _, stream_id, actor_id, endpoint, remaining, chain, body, window = message
        deadline = None if remaining is None else self.loop.time() + remaining
        outlet = _RemoteOutlet(self, src, stream_id, window)
        received = Message(endpoint, (), {}, self.new_key(), tuple(chain), deadline, outlet)
        received.outlet, outlet.message = outlet, received
        received.carried = carried
        if self.instruments.arrived is not None:
            self.instruments.arrived(received, "stream", src, stream_id)
        cell = self.cells.get(actor_id)
        if cell is None:
            self.log.debug("stream refused: actor stopped", src=src, actor=actor_id, endpoint=endpoint)
            gone = ActorStoppedError(
                f"no longer hosts actor #{actor_id}; stream {endpoint!r} refused (node {self.rank})"
            )
            outlet.error(received, gone, Origin.GONE)
            self.codec.drop(body)
            return
        self.producing[(src, stream_id)] = (cell, received)
        self.streams_served += 1
        if body is not None and not self.take_arguments(src, cell, received, body, tensors):
            return
        cell.deliver(received)

    def on_more(self, src: int, stream_id: int, count: int) -> None:
        """The consumer of a stream this node produces took more items."""
        produced = self.producing.get((src, stream_id))
        if produced is not None:
            outlet = produced[1].outlet
            assert outlet is not None
            outlet.more(count)

    def on_close(self, src: int, stream_id: int) -> None:
        """The consumer left a stream this node produces: close its generator."""
        produced = self.producing.pop((src, stream_id), None)
        if produced is not None:
            cell, message = produced
            cell.cancel(message)

    def served(self, outlet: _RemoteOutlet) -> bool:
        """A stream this node produces ended: forget it; False if its consumer cannot hear of it any more."""
        self.producing.pop((outlet.src, outlet.stream_id), None)
        return outlet.src not in self.lost and not self.closed

    def send_control(self, rank: int, message: list[Any]) -> None:
        """Send a stream's credits, close or end to ``rank``."""
        if rank not in self.lost and not self.closed:
            self.transport.send(rank, self.pack(message))

    # ------------------------------------------------------------------ loss and close

    def fail_rank(self, rank: int, why: str) -> None:
        """Node ``rank`` is gone: streams from it fail (``NodeLostError``, or ``ActorStoppedError`` if it left).

        Streams to it stop.
        """
        for link in [link for link in self.consuming.values() if link.opening.rank == rank]:
            self.consuming.pop(link.stream_id, None)
            opening = link.opening
            link.end(
                self.left_error(rank, f"{opening.label} stopped streaming {opening.endpoint!r}")
                or NodeLostError(f"node {rank} was lost while streaming {opening.endpoint!r} of {opening.label}: {why}")
            )
        for key in [key for key in self.producing if key[0] == rank]:
            self.on_close(*key)

    def close(self) -> None:
        """This node shuts down: streams it consumes fail with ``SystemClosedError``."""
        self.closed = True
        links, self.consuming = list(self.consuming.values()), {}
        for link in links:
            link.end(
                SystemClosedError(
                    f"node {self.rank} shut down while streaming {link.opening.endpoint!r} of {link.opening.label}"
                )
            )
