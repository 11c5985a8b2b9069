"""Instruments: what observes a node's messages (metrics, a timeline, spans), behind one set of hooks.

An :class:`Instrument` overrides the hooks it needs, the rest cost nothing. A
node keeps its instruments in one :class:`Instruments`, which holds, for each
hook, a callable that runs it on every instrument that has it, or None when
none has: the message path tests that attribute and calls nothing else, so a
hook nobody observes costs one attribute read per message. An instrument whose
hook raises is removed from the node and logged once: an observer must never
break the calls it observes (trio's instruments work so).

A message's life, as the hooks see it:

- on its sender's node: ``sending`` (a call or stream as it is made, a tell as
  it leaves), ``sent`` (it left, on the wire or to an actor of this node) and,
  for a call or stream, ``reply`` (its outcome: ``ok``, ``error``,
  ``cancelled``, ``lost``, and for a stream ``closed``, its consumer gone);
- on its actor's node: ``arrived`` (it came from another node),
  ``mailbox_wait`` (it waited in the actor's mailbox), ``serving`` (the handler
  as it will run: an instrument may wrap it, to run it in a span), ``handled``
  (the handler ran; a batched endpoint's run is one, and ``serving_batch``
  wraps it), and ``stream_item`` for each item a stream's producer sends.

What a message carries for instruments is its :class:`Outgoing`'s ``carrier``:
``sending`` writes into it, and the receiving node's hooks find it in
``Message.carried``. To another node it travels as one more element of the
envelope (see ``wire``), only when some instrument wrote into it, so it must
hold plain values there; between actors of one node it is handed over as it
is, and may hold objects.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol

from actorch._base.errors import NodeLostError
from actorch._engine.message import CallContext, Message

__all__ = [
    "HOOKS",
    "LOCAL",
    "ActorView",
    "Handling",
    "Instrument",
    "Instruments",
    "Outgoing",
    "OutgoingMessage",
    "Verb",
    "outcome_of",
]

Verb = Literal["call", "tell", "stream"]
"""What a message asks of its actor."""

LOCAL = "local"
"""The path of a message between actors of one node: it skips the wire (a transport names the others)."""

HOOKS = (
    "sending",
    "sent",
    "reply",
    "arrived",
    "mailbox_wait",
    "serving",
    "serving_batch",
    "handled",
    "stream_item",
)
"""Every hook of :class:`Instrument`, in the order of a message's life."""

_WRAPPING = frozenset({"serving", "serving_batch"})
"""The hooks that return what they were given, wrapped (the handler as it will run)."""


class ActorView(Protocol):
    """What hooks see of the actor a message is for: its cell."""

    @property
    def actor_id(self) -> int:
        """The actor's id on its node (the runtime's own actors have the lowest)."""

    @property
    def label(self) -> str:
        """The actor as logs and errors name it: ``actor 'a' (Counter) on node 1``."""

    @property
    def instance(self) -> object:
        """The actor's instance."""

    @property
    def metrics(self) -> dict[str, Any]:
        """What the metrics instrument counts of the actor's endpoints, kept with its cell."""


Handling = Message | CallContext
"""A handler run: a message's, or a same-node call's run in its caller's task (its ``CallContext``)."""


class Outgoing:
    """One call, tell or stream this node sends, as its instruments see it from ``sending`` to ``reply``.

    The hooks read and write the attributes below. A call to another node is
    its own record (an ``ObservedCall``, in ``calls``), so that a call in
    flight costs no second object; every other message has an
    :class:`OutgoingMessage`. This base holds no slots, so that a future can
    be one too.

    Attributes:
        verb: ``call``, ``tell`` or ``stream``.
        rank: The node of the actor it goes to.
        actor_id: The actor's id there.
        label: The actor, as logs and errors name it.
        endpoint: The endpoint it asks for.
        path: How it goes: ``local`` to an actor of this node, else the
            transport's path (``lane``, ``torch_rpc``, ``in_process``), known
            once it is sent (None before).
        ident: Its call or stream id once sent (0 for a tell, and between
            actors of one node).
        carrier: What it carries to the instruments of the node that handles
            it (see the module's docstring); None until an instrument writes.
        notes: What each instrument keeps of it meanwhile, by instrument.
    """

    if not TYPE_CHECKING:  # mypy would take an empty tuple to mean that no field may be set, here or on a subclass
        __slots__ = ()  # none of its own, so that a future can be one too: its subclasses hold the fields

    verb: Verb
    rank: int
    actor_id: int
    label: str
    endpoint: str
    path: str | None
    ident: int
    carrier: dict[str, Any] | None
    notes: dict[Instrument, Any] | None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.verb} {self.endpoint!r} of {self.label} path={self.path}>"

    def carry(self) -> dict[str, Any]:
        """The carrier, made on first use: write what the receiving side's instruments need into it."""
        carrier = self.carrier
        if carrier is None:
            carrier = self.carrier = {}
        return carrier

    def note(self, instrument: Instrument, value: Any) -> None:
        """Keep ``value`` for ``instrument`` until the message's later hooks."""
        if self.notes is None:
            self.notes = {}
        self.notes[instrument] = value

    def noted(self, instrument: Instrument) -> Any:
        """What ``instrument`` kept of this message, forgotten now; None if nothing."""
        return None if self.notes is None else self.notes.pop(instrument, None)


class OutgoingMessage(Outgoing):
    """The record of a tell, a stream or a same-node call (``Instruments.made``): ``Outgoing``'s fields, in slots."""

    __slots__ = ("actor_id", "carrier", "endpoint", "ident", "label", "notes", "path", "rank", "verb")

    def __init__(self, verb: Verb, rank: int, actor_id: int, label: str, endpoint: str, path: str | None) -> None:
        self.verb = verb
        self.rank = rank
        self.actor_id = actor_id
        self.label = label
        self.endpoint = endpoint
        self.path = path
        self.ident = 0
        self.carrier = None
        self.notes = None


def outcome_of(error: BaseException | None) -> str:
    """How a call ended, as its ``reply`` hook names it: ``ok``, ``cancelled``, ``lost`` (its node) or ``error``."""
    if error is None:
        return "ok"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    return "lost" if isinstance(error, NodeLostError) else "error"


class Instrument:
    """An observer of one node's messages: a subclass overrides the hooks it needs.

    Hooks run on the node's event loop, in the message path itself: they must
    be quick and must not block. One that raises is removed from its node (and
    logged once). Install one with ``Instruments.add``.
    """

    __slots__ = ()

    guarded: bool = True
    """Whether its hooks run inside the guard that removes it if one raises. Only the runtime's own
    ``Metrics``, whose one hook cannot fail but through a bug of the runtime's, runs unguarded: alone on
    a hook, it is then called directly, one frame the fewer per message."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"

    # ------------------------------------------------------------------ the sender's node

    def sending(self, out: Outgoing) -> None:
        """A call or stream is made (before its arguments are encoded), or a tell is about to leave.

        Write into ``out.carry()`` what this instrument on the receiving node
        needs; keep what it needs of the message later with ``out.note``.
        """

    def sent(self, out: Outgoing, body: bytes | None, wire: bytes | None, tensors: list[Any] | None) -> None:
        """It left: ``wire`` (its envelope, ``body`` its arguments, ``tensors`` beside them) to another node.

        To an actor of this node all three are None, and ``out.path`` is ``local``.
        """

    def reply(self, out: Outgoing, outcome: str, error: BaseException | None) -> None:
        """A call or stream this node made has its outcome (``outcome_of``; a stream its consumer left: ``closed``).

        ``error`` is what its caller gets, if it failed.
        """

    # ------------------------------------------------------------------ the actor's node

    def arrived(self, message: Message, verb: Verb, src: int, ident: int) -> None:
        """``message`` came from node ``src`` for an actor of this node (``ident``: its call or stream id, a tell's 0).

        ``message.carried`` is what its sender's instruments carried (None:
        nothing); write into it what the later hooks need of the message.
        """

    def mailbox_wait(self, actor: ActorView, message: Message) -> None:
        """``message`` waited in the actor's mailbox from ``message.queued_at`` to ``message.started``."""

    def serving(
        self, actor: ActorView, endpoint: str, handler: Awaitable[Any], carried: dict[str, Any] | None
    ) -> Awaitable[Any]:
        """The handler of a message for ``endpoint``, as it will run: return it, or an awaitable that wraps it.

        ``carried`` is the message's (``Message.carried``). An error raised
        here removes the instrument; one its wrapper raises is the handler's.
        """
        return handler

    def serving_batch(
        self, actor: ActorView, endpoint: str, handler: Awaitable[Any], carried: list[dict[str, Any] | None]
    ) -> Awaitable[Any]:
        """One run of a batched endpoint, as it will run (``carried``: each call's, in order); as ``serving``."""
        return handler

    def handled(self, actor: ActorView, handling: Handling, ended: int, failed: bool, count: int) -> None:
        """A handler ran, from ``handling.started`` to ``ended`` (``perf_counter_ns``), and raised or not.

        ``handling`` is its message, or the ``CallContext`` of a same-node
        call run in its caller's task; ``count`` is the messages it answered
        (a batched endpoint's run answers several).
        """

    def stream_item(self, message: Message, index: int, wire: bytes | None, tensors: list[Any] | None) -> None:
        """The producer of stream ``message`` sent its ``index``-th item (``wire``: None to a consumer of this node)."""


class Instruments:
    """The instruments of one node, and for each hook the callable that runs it on them (None: none has it).

    Args:
        rank: The node's rank.
        log: The node's logger: an instrument that fails is logged there.
        path: The path a message to a node takes, with tensors of its own or not (``Transport.path``).
    """

    __slots__ = (
        "_installed",
        "_log",
        "_on_reply",
        "_on_sending",
        "_on_sent",
        "_path",
        "arrived",
        "handled",
        "mailbox_wait",
        "outgoing",
        "rank",
        "reply",
        "sending",
        "sent",
        "serving",
        "serving_batch",
        "stream_item",
    )

    # Each hook: what runs it on every instrument that has it, or None (the message path tests that).
    sending: Callable[[Outgoing], None] | None
    sent: Callable[[Outgoing, bytes | None, bytes | None, list[Any] | None], None] | None
    reply: Callable[[Outgoing, str, BaseException | None], None] | None
    arrived: Callable[[Message, Verb, int, int], None] | None
    mailbox_wait: Callable[[ActorView, Message], None] | None
    serving: Callable[[ActorView, str, Awaitable[Any], dict[str, Any] | None], Awaitable[Any]] | None
    serving_batch: Callable[[ActorView, str, Awaitable[Any], list[dict[str, Any] | None]], Awaitable[Any]] | None
    handled: Callable[[ActorView, Handling, int, bool, int], None] | None
    stream_item: Callable[[Message, int, bytes | None, list[Any] | None], None] | None

    def __init__(self, rank: int, log: Any, path: Callable[[int, bool], str]) -> None:
        self.rank = rank
        self._log = log
        self._path = path
        self._installed: list[Instrument] = []
        self.outgoing = False  # whether any instrument observes what this node sends
        self._rebuild()

    def __repr__(self) -> str:
        return f"<Instruments node {self.rank} {self._installed!r}>"

    def __iter__(self) -> Iterator[Instrument]:
        return iter(tuple(self._installed))

    def __contains__(self, instrument: object) -> bool:
        return instrument in self._installed

    def add(self, instrument: Instrument) -> None:
        """Install ``instrument``: its hooks run from the next message on.

        Raises:
            ValueError: It is installed already.
        """
        if instrument in self._installed:
            raise ValueError(f"{instrument!r} is installed already on node {self.rank}")
        self._installed.append(instrument)
        self._rebuild()

    def remove(self, instrument: Instrument) -> None:
        """Uninstall ``instrument``: its hooks run no more.

        Raises:
            KeyError: It is not installed.
        """
        if instrument not in self._installed:
            raise KeyError(f"{instrument!r} is not installed on node {self.rank}")
        self._installed.remove(instrument)
        self._rebuild()

    # ------------------------------------------------------------------ for the message path

    def made(
        self,
        verb: Verb,
        rank: int,
        actor_id: int,
        label: str,
        endpoint: str,
        future: asyncio.Future[Any] | None = None,
    ) -> Outgoing:
        """A message is made for ``endpoint`` of actor ``actor_id`` on ``rank``: its record, after ``sending``.

        ``future`` is a same-node call's, whose outcome is then its ``reply``
        (a call to another node is its own record and reports its own: see
        ``ObservedCall``).
        """
        out = OutgoingMessage(verb, rank, actor_id, label, endpoint, LOCAL if rank == self.rank else None)
        self.began(out)
        if future is not None and self._on_reply:
            future.add_done_callback(functools.partial(self._settled, out))
        return out

    def began(self, out: Outgoing) -> None:
        """``out``, a record just made, is reported ``sending``."""
        for instrument, method in self._on_sending:
            try:
                method(out)
            except Exception as exc:  # noqa: BLE001 - the instrument's own error: it goes, the message goes on
                self._failed(instrument, "sending", exc)

    def made_here(
        self, verb: Verb, actor_id: int, label: str, endpoint: str, future: asyncio.Future[Any] | None = None
    ) -> dict[str, Any] | None:
        """A message to an actor of this node is made and handed to it at once: what it carries (``made``, ``sent``)."""
        out = self.made(verb, self.rank, actor_id, label, endpoint, future)
        self.left(out)
        return out.carrier

    def left(
        self,
        out: Outgoing,
        ident: int = 0,
        body: bytes | None = None,
        wire: bytes | None = None,
        tensors: list[Any] | None = None,
    ) -> None:
        """``out`` left as ``ident`` (its call or stream id), in ``wire``; or to an actor of this node (no wire)."""
        out.ident = ident
        if out.path is None:
            out.path = self._path(out.rank, bool(tensors))
        for instrument, method in self._on_sent:
            try:
                method(out, body, wire, tensors)
            except Exception as exc:  # noqa: BLE001 - as in began
                self._failed(instrument, "sent", exc)

    def packed(
        self,
        out: Outgoing,
        envelope: list[Any],
        pack: Callable[[Any], bytes],
        ident: int,
        body: bytes | None,
        tensors: list[Any] | None,
    ) -> bytes:
        """``envelope`` packed with what ``out`` carries (if anything), and ``out`` reported ``sent`` (``left``)."""
        if out.carrier:
            envelope.append(out.carrier)
        wire = pack(envelope)
        self.left(out, ident, body, wire, tensors)
        return wire

    def settle(self, out: Outgoing, error: BaseException | None = None, outcome: str | None = None) -> None:
        """``out``, a call or stream, has its outcome: ``error``, or ``outcome`` (by default, ``outcome_of(error)``)."""
        if not self._on_reply:
            return
        outcome = outcome or ("ok" if error is None else outcome_of(error))
        for instrument, method in self._on_reply:
            try:
                method(out, outcome, error)
            except Exception as exc:  # noqa: BLE001 - as in began
                self._failed(instrument, "reply", exc)

    def _settled(self, out: Outgoing, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self.settle(out, outcome="cancelled")
        else:
            self.settle(out, future.exception())

    # ------------------------------------------------------------------ internals

    def _rebuild(self) -> None:
        """Set each hook's attribute: None if no instrument overrides it, else what runs each one that does.

        The sender's three hooks also run in place, in ``began``, ``left``
        (which ``packed`` calls) and ``settle``, which the message path calls
        anyway: one frame less each.
        """
        for hook in HOOKS:
            methods = self._methods(hook)
            setattr(self, hook, self._dispatch(hook, methods) if methods else None)
        self._on_sending = self._methods("sending")
        self._on_sent = self._methods("sent")
        self._on_reply = self._methods("reply")
        self.outgoing = bool(self._on_sending or self._on_sent or self._on_reply)

    def _methods(self, hook: str) -> Methods:
        """Each installed instrument that overrides ``hook``, with its bound method, in the order installed."""
        default = getattr(Instrument, hook)
        return tuple(
            (instrument, getattr(instrument, hook))
            for instrument in self._installed
            if getattr(type(instrument), hook) is not default
        )

    def _dispatch(self, hook: str, methods: Methods) -> Callable[..., Any]:
        """What runs ``hook``'s ``methods``, so that an error removes that instrument rather than reach the path."""
        failed = self._failed
        if len(methods) == 1 and not methods[0][0].guarded:
            return methods[0][1]  # the runtime's own, alone: called directly (see Instrument.guarded)
        if hook not in _WRAPPING:
            return _RUNNERS[_ARITY[hook]](hook, methods, failed)

        def wrap(actor: Any, endpoint: str, handler: Awaitable[Any], carried: Any) -> Awaitable[Any]:
            for instrument, method in methods:
                try:
                    handler = method(actor, endpoint, handler, carried)
                except Exception as exc:  # noqa: BLE001 - the instrument's own error: it goes, the handler runs
                    failed(instrument, hook, exc)
            return handler

        return wrap

    def _failed(self, instrument: Instrument, hook: str, exc: Exception) -> None:
        """``instrument`` raised in ``hook``: remove it, and log it (once: it runs no more)."""
        if instrument in self._installed:
            self.remove(instrument)
            self._log.error("instrument failed and was removed", instrument=repr(instrument), hook=hook, exc_info=exc)


# A hook runs for every message: what runs it takes the hook's own arguments, not *args, which would cost as
# much again, and catches each instrument's error in the one frame.
Methods = tuple[tuple[Instrument, Callable[..., Any]], ...]
Failed = Callable[[Instrument, str, Exception], None]


def _runs1(hook: str, methods: Methods, failed: Failed) -> Callable[..., None]:
    def run(a: Any) -> None:
        for instrument, method in methods:
            try:
                method(a)
            except Exception as exc:  # noqa: BLE001 - the instrument's own error: it goes, the message goes on
                failed(instrument, hook, exc)

    return run


def _runs2(hook: str, methods: Methods, failed: Failed) -> Callable[..., None]:
    def run(a: Any, b: Any) -> None:
        for instrument, method in methods:
            try:
                method(a, b)
            except Exception as exc:  # noqa: BLE001 - as in _runs1
                failed(instrument, hook, exc)

    return run


def _runs3(hook: str, methods: Methods, failed: Failed) -> Callable[..., None]:
    def run(a: Any, b: Any, c: Any) -> None:
        for instrument, method in methods:
            try:
                method(a, b, c)
            except Exception as exc:  # noqa: BLE001 - as in _runs1
                failed(instrument, hook, exc)

    return run


def _runs4(hook: str, methods: Methods, failed: Failed) -> Callable[..., None]:
    def run(a: Any, b: Any, c: Any, d: Any) -> None:
        for instrument, method in methods:
            try:
                method(a, b, c, d)
            except Exception as exc:  # noqa: BLE001 - as in _runs1
                failed(instrument, hook, exc)

    return run


def _runs5(hook: str, methods: Methods, failed: Failed) -> Callable[..., None]:
    def run(a: Any, b: Any, c: Any, d: Any, e: Any) -> None:
        for instrument, method in methods:
            try:
                method(a, b, c, d, e)
            except Exception as exc:  # noqa: BLE001 - as in _runs1
                failed(instrument, hook, exc)

    return run


_RUNNERS = {1: _runs1, 2: _runs2, 3: _runs3, 4: _runs4, 5: _runs5}
_ARITY = {
    "sending": 1,
    "sent": 4,
    "reply": 3,
    "arrived": 4,
    "mailbox_wait": 2,
    "handled": 5,
    "stream_item": 4,
}
"""How many arguments each hook that returns nothing takes."""
