"""One call or tell to many actors with the same arguments: encoded once per node, fanned out there.

:func:`call_many` and :func:`tell_many` belong to the caller (``caller.py``),
kept in a module of their own: they use its pending calls, call ids and
windows. The targets on each other node get one ``CAST`` message (see
``wire``) whose body is encoded once for that node, so each tensor travels once
per node however many of its actors are called; that node decodes it once and
hands it to each actor (``Callee.on_cast``). A tensor the data plane places
apart from the message (shared memory, a GPU block) is placed once for the
whole multicast and lent to every node that reaches it: the actors of one host
(or one GPU) share one read-only copy. Each target keeps its own outcome:
its own ``RemoteCall`` (result, error, cancellation, deadline, window slot) for
a call, its own refusal for a tell. Instruments see each target's call or
tell as its own message, and the ``CAST`` carries what they carry for each
one, in target order.

The single-call path serves what one message cannot: targets on the caller's
own node (by reference, as always), a node with one target, a node that is
lost or arguments that cannot be sent (each target then gets its own error),
and every call made in a distributed autograd context or off the node's loop.
A target whose window is full waits for room on its own (a call), or is
refused with ``MailboxFullError`` (a tell), while the others go at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, cast

from actorch._engine.calls import ObservedCall
from actorch._engine.message import current_call
from actorch._engine.wire import CAST, check_size
from actorch._transport.autograd import NO_CONTEXT, current_context_id

if TYPE_CHECKING:
    from actorch._engine.caller import Caller
    from actorch._engine.calls import RemoteCall
    from actorch._engine.instruments import Outgoing

__all__ = ["CastTarget", "call_many", "tell_many"]

CastTarget = tuple[int, int, str]
"""One actor a multicast goes to: ``(rank, actor_id, label)``."""

Encoded = tuple[bytes | None, list[Any] | None]
"""A message body encoded for one node, and its tensors."""


def call_many(
    caller: Caller,
    targets: Sequence[CastTarget],
    endpoint: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    deadline: float | None,
) -> list[Coroutine[Any, Any, Any]]:
    """Call ``endpoint`` of every target with the same arguments; one awaitable per target, in target order.

    Each awaitable behaves as one ``Caller.call`` returns (errors are raised
    where it is awaited; cancelling it cancels that target's handler only).
    """
    if asyncio.events._get_running_loop() is not caller.loop or current_context_id() != NO_CONTEXT:
        # Off the loop each call is made once it runs there; in an autograd context each one leaves alone.
        return [
            caller.call(rank, actor_id, endpoint, args, kwargs, label, deadline) for rank, actor_id, label in targets
        ]
    calls: list[Coroutine[Any, Any, Any] | None] = [None] * len(targets)
    context = current_call.get()
    chain = context.child_chain() if context is not None else ()
    device = context.device if context is not None else None
    shared: dict[Any, Any] = {}  # what the data plane placed once for every node (one copy per host or GPU)
    for rank, indices in _by_rank(targets).items():
        encoded = _encode_for(caller, rank, args, kwargs, copy=False, shared=shared) if len(indices) > 1 else None
        if encoded is None:
            for index in indices:
                _, actor_id, label = targets[index]
                calls[index] = caller.call(rank, actor_id, endpoint, args, kwargs, label, deadline)
            continue
        cast: list[RemoteCall[Any]] = []
        for index in indices:
            _, actor_id, label = targets[index]
            if not caller.flow.try_take((rank, actor_id)):  # this one waits for room and goes alone, its own copy
                calls[index] = caller.call(rank, actor_id, endpoint, args, kwargs, label, deadline)
                continue
            call = caller.new_call((rank, actor_id), endpoint, label)
            call.device = device
            calls[index] = call
            cast.append(call)
        if cast:
            _send_calls(caller, rank, cast, endpoint, chain, deadline, encoded)
        else:
            caller.codec.drop(encoded[0])  # nobody took the body: what its tensors lend goes back
    return calls  # type: ignore[return-value] # every target has its call now


def tell_many(
    caller: Caller, targets: Sequence[CastTarget], endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Exception | None]:
    """Tell ``endpoint`` of every target the same arguments; return each target's refusal, or None if sent.

    Tensors are copied at once (once per node), as ``Caller.tell`` does, so the
    sender may reuse its own.
    """
    outcomes: list[Exception | None] = [None] * len(targets)
    alone = current_context_id() != NO_CONTEXT  # tells made in an autograd context leave alone, like calls
    shared: dict[Any, Any] = {}  # what the data plane placed once for every node (one copy per host or GPU)
    for rank, indices in _by_rank(targets).items():
        many = not alone and len(indices) > 1
        encoded = _encode_for(caller, rank, args, kwargs, copy=True, shared=shared) if many else None
        if encoded is None:
            for index in indices:
                _, actor_id, label = targets[index]
                try:
                    caller.tell(rank, actor_id, endpoint, args, kwargs, label)
                except Exception as exc:  # noqa: BLE001 - this target's refusal: the others are still sent
                    outcomes[index] = exc
            continue
        actor_ids: list[int] = []
        labels: list[str] = []
        for index in indices:
            _, actor_id, label = targets[index]
            if caller.flow.try_take((rank, actor_id)):
                actor_ids.append(actor_id)
                labels.append(label)
            else:
                outcomes[index] = caller._mailbox_full(endpoint, label)
        if actor_ids:
            caller.tells_sent += len(actor_ids)
            body, tensors = encoded
            envelope = [CAST, None, actor_ids, endpoint, None, (), body]
            outs = None
            if caller.instruments.outgoing:
                made = caller.instruments.made
                outs = [
                    made("tell", rank, each, label, endpoint) for each, label in zip(actor_ids, labels, strict=True)
                ]
            caller.transport.send(rank, _packed(caller, envelope, outs, None, tensors), tensors)
        else:
            caller.codec.drop(encoded[0])  # every target was refused: what its tensors lend goes back
    return outcomes


def _by_rank(targets: Sequence[CastTarget]) -> dict[int, list[int]]:
    """The indices of ``targets`` by the rank hosting them, in target order."""
    ranks: dict[int, list[int]] = {}
    for index, target in enumerate(targets):
        ranks.setdefault(target[0], []).append(index)
    return ranks


def _encode_for(
    caller: Caller, rank: int, args: tuple[Any, ...], kwargs: dict[str, Any], *, copy: bool, shared: dict[Any, Any]
) -> Encoded | None:
    """The arguments encoded once for ``rank``; None where each target takes the single path.

    That is this node (its actors get the arguments by reference), a node that
    is lost or a node that is shut down, and arguments that cannot be sent:
    the single path gives each target its own error. ``shared`` is the whole
    multicast's: a tensor the data plane placed for one node (a segment of
    shared memory, a GPU block) is lent as it is to the others that reach it.
    """
    if rank == caller.rank or rank in caller.lost or caller.closed:
        return None
    if not (args or kwargs):
        return None, None
    body = None
    try:
        body, tensors = caller.codec.encode(
            [args, kwargs], copy_tensors=copy, route=caller.transport.route(rank), arguments=True, shared=shared
        )
        check_size(body, tensors, caller.max_message_size, "a multicast to node {}", rank)
    except Exception:  # noqa: BLE001 - each target's own call raises it again, with its own name
        caller.codec.drop(body)
        return None
    return body, tensors


def _send_calls(
    caller: Caller,
    rank: int,
    calls: list[RemoteCall[Any]],
    endpoint: str,
    chain: tuple[int, ...],
    deadline: float | None,
    encoded: Encoded,
) -> None:
    """Send ``calls`` (each holding a slot of its window) to ``rank`` as one ``CAST``, unless the deadline passed."""
    remaining = None
    if deadline is not None:
        remaining = deadline - caller.loop.time()
        if remaining <= 0:
            for call in calls:
                caller.flow.release(call.target)
                call.settled()
                call.set_exception(TimeoutError(f"deadline passed before calling {endpoint!r} of {call.label}"))
            caller.codec.drop(encoded[0])
            return
    call_ids: list[int] = []
    for call in calls:
        call.call_id = call_id = next(caller._call_ids)
        caller.pending[call_id] = call
        call_ids.append(call_id)
    actor_ids = [call.target[1] for call in calls]
    body, tensors = encoded
    envelope = [CAST, call_ids, actor_ids, endpoint, remaining, chain, body]
    # Made together, so all observed or none; an observed call is its own record.
    outs = cast("list[Outgoing]", calls) if isinstance(calls[0], ObservedCall) else None
    caller.transport.send(rank, _packed(caller, envelope, outs, call_ids, tensors), tensors)
    caller.calls_sent += len(calls)


def _packed(
    caller: Caller, envelope: list[Any], outs: Sequence[Outgoing | None] | None, ids: list[int] | None, tensors: Any
) -> bytes:
    """A ``CAST``'s envelope packed with what each target's instruments carry (if any), each target reported sent."""
    if outs is None:
        return caller.pack(envelope)
    carriers = [None if out is None else out.carrier for out in outs]
    if any(carriers):
        envelope.append(carriers)
    wire = caller.pack(envelope)
    body = envelope[6]
    for index, out in enumerate(outs):
        if out is not None:
            caller.instruments.left(out, 0 if ids is None else ids[index], body, wire, tensors)
    return wire
