"""The ``Actor`` base class and how its endpoints are found.

Every public ``async def`` method of a subclass (inherited ones included) is an
endpoint, and so is every ``@batched`` one; names starting with ``_`` never
are, nor are the lifecycle hooks.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from actorch._base.config import is_count
from actorch._base.devices import parse_device
from actorch._engine.batching import Batched
from actorch._engine.endpoints import Endpoint

if TYPE_CHECKING:
    from actorch._actors.ref import ActorRef
    from actorch._actors.system import ActorSystem

__all__ = ["Actor", "attach", "check_plain_methods", "class_path", "endpoints_of", "has_state_hooks", "place"]

_HOOKS = frozenset({"on_start", "on_stop"})
_RUNTIME = frozenset({"save_snapshot"})
"""Methods ``Actor`` gives every actor: never endpoints, and a subclass may not define its own."""

_STATE_HOOKS = frozenset({"snapshot", "restore"})
"""Hooks the runtime calls that a class may write as plain ``def`` (``has_state_hooks``, relocation)."""


class Actor:
    """Base class of actors: subclass it and write public ``async`` methods.

    The runtime builds the instance on its hosting node, sets :attr:`ref`,
    :attr:`name` and :attr:`system`, runs ``__init__`` and then :meth:`on_start`
    as the actor's first message. By default the actor handles one message at a
    time; set the class attribute ``max_concurrency`` to let handlers interleave
    at ``await`` points.

    An actor has a :attr:`device`: the CPU unless the class says otherwise
    (``device = "cuda:0"``) or it was spawned with ``device=`` or ``gpus=``.
    Its hooks and handlers run with that device current, and tensors staged
    through host memory on their way to it arrive on it.

    A handler that raises one of the class's ``fatal_errors`` fails the actor:
    it is restarted if it was spawned with a ``Restart`` policy, else stopped.
    A class that defines ``snapshot()`` and ``restore(state)`` (plain or async)
    keeps what ``snapshot`` returns across such a restart. An actor spawned with
    ``Restart(relocate=True)`` also outlives its node: it hands the state to
    keep with :meth:`save_snapshot`, and ``restore(state)`` gets it back on the
    node it moves to.

    Example:
        >>> class Counter(Actor):
        ...     def __init__(self, start: int = 0) -> None:
        ...         self.value = start
        ...     async def add(self, k: int = 1) -> int:
        ...         self.value += k
        ...         return self.value
    """

    max_concurrency: ClassVar[int] = 1
    """How many messages may run at once (interleaving only at ``await`` points)."""

    fatal_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    """Exceptions that, raised by a handler, mean the actor's state cannot be trusted: it fails."""

    device: torch.device = torch.device("cpu")
    """The actor's device (set it on the class as ``"cuda:0"``, or per actor with ``spawn(device=...)``)."""

    _actorch_endpoints: ClassVar[dict[str, Endpoint]] = {}
    _actorch_plain: ClassVar[tuple[str, ...]] = ()
    _actorch_ref: ActorRef[Any]
    _actorch_system: ActorSystem

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        concurrency = cls.__dict__.get("max_concurrency", cls.max_concurrency)
        if not is_count(concurrency):
            raise TypeError(f"{cls.__qualname__}.max_concurrency must be an int >= 1, not {concurrency!r}")
        if "device" in cls.__dict__:
            try:
                cls.device = parse_device(cls.__dict__["device"], f"{cls.__qualname__}.device")
            except ValueError as exc:
                raise TypeError(str(exc)) from None
        fatal = cls.__dict__.get("fatal_errors", cls.fatal_errors)
        if not isinstance(fatal, tuple) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in fatal
        ):
            raise TypeError(f"{cls.__qualname__}.fatal_errors must be a tuple of exception classes, not {fatal!r}")
        taken = sorted(_RUNTIME & cls.__dict__.keys())
        if taken:
            raise TypeError(f"{cls.__qualname__}.{taken[0]} is a method every actor has from actorch.Actor: rename it")
        found: dict[str, Endpoint] = {}
        plain: list[str] = []
        for attr in dir(cls):
            value = inspect.getattr_static(cls, attr)
            if isinstance(value, Batched):
                if attr.startswith("_") or attr in _HOOKS:
                    raise TypeError(f"{cls.__qualname__}.{attr} is batched, so an endpoint: its name must be public")
                found[attr] = value
                continue
            if attr.startswith("_") or attr in _HOOKS or attr in _RUNTIME:
                continue
            if isinstance(value, (staticmethod, classmethod)):
                continue
            if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value):  # a call's, or a stream's
                found[attr] = value
            elif inspect.isfunction(value) and attr not in _STATE_HOOKS and not _actorch_defines(cls, attr):
                plain.append(attr)
        cls._actorch_endpoints = found
        cls._actorch_plain = tuple(plain)

    def __repr__(self) -> str:
        ref = getattr(self, "_actorch_ref", None)
        return f"<{type(self).__qualname__} {ref!r}>" if ref is not None else object.__repr__(self)

    @property
    def ref(self) -> ActorRef[Any]:
        """A ref to this actor, to hand to others."""
        return self._actorch_ref

    @property
    def name(self) -> str | None:
        """The name this actor was spawned under, if any."""
        return self._actorch_ref.name

    @property
    def system(self) -> ActorSystem:
        """The actor system of this actor's node: spawn, look up and call others."""
        return self._actorch_system

    async def on_start(self) -> None:
        """Run once after ``__init__``, before any message; raising aborts the spawn."""

    async def on_stop(self) -> None:
        """Run once after the last message, when the actor stops or the system shuts down."""

    async def save_snapshot(self, state: Any) -> bool:
        """Keep ``state`` where it outlives this node, as what a relocation hands to ``restore(state)``.

        For an actor spawned with ``Restart(relocate=True)``: ``state`` is sent
        to rank 0, which keeps the last one saved (tensors travel as tensors,
        once each, and replace the previous state there). If the actor's node
        is lost, the actor is started again on another node and its class's
        ``restore(state)`` gets the last state saved before its ``on_start``;
        what changed after that save is lost. Returns once rank 0 holds it:
        until then, ``state`` must not change (an actor that lets handlers
        interleave holds its writers back meanwhile).

        With a snapshot directory (``run(snapshots=DIR)``), a named actor's
        state is also written to a file there before this returns, and a
        system started again with the same directory starts the actor, spawned
        under the same name, from it. A ``restore=`` keyword its spawn gives
        explicitly wins over the directory.

        Returns:
            Whether the state was kept: False, and nothing sent, for an actor
            that is not relocatable (spawned without ``Restart(relocate=True)``).

        Raises:
            TypeError: The class defines no ``restore(state)`` to hand it back to.
            ActorStoppedError: This instance no longer hosts the actor (its
                node was counted lost and the actor moved on).
            SerializationError: ``state`` cannot be sent, or written to a file.
            OSError: The snapshot directory's file cannot be written (rank 0
                keeps the state in memory all the same).
        """
        if not callable(getattr(type(self), "restore", None)):
            raise TypeError(f"{type(self).__qualname__} defines no restore(state): a saved snapshot could not return")
        return await self._actorch_ref._keep_snapshot(state)


def has_state_hooks(cls: type[Actor]) -> bool:
    """Whether ``cls`` defines ``snapshot()`` (taking no argument) and ``restore(state)``, kept across a restart.

    A ``snapshot`` that needs arguments is an endpoint of its own (the replay
    buffer's ``snapshot(path)`` writes a file), not the hook.
    """
    snapshot = getattr(cls, "snapshot", None)
    if not (callable(snapshot) and callable(getattr(cls, "restore", None))):
        return False
    try:
        inspect.signature(snapshot).bind(None)  # self alone
    except (TypeError, ValueError):
        return False
    return True


def _actorch_defines(cls: type, name: str) -> bool:
    """Whether a class of actorch in ``cls``'s bases defines ``name``: a stock hook such as ``Agent.act``."""
    return any(name in vars(base) and base.__module__.partition(".")[0] == "actorch" for base in cls.__mro__)


def check_plain_methods(cls: type[Actor]) -> None:
    """Refuse, before a spawn, a class with a public plain ``def`` method: callers could not call it.

    Only ``async def`` methods are endpoints; a public ``def`` is almost always
    one meant to be, so it is refused with the fix rather than left to fail at
    its first call. The state hooks (``snapshot``, ``restore``) and the hooks of
    actorch's own classes that a subclass overrides (``Agent.act``) are plain
    ``def`` on purpose and pass.

    Raises:
        TypeError: Naming each such method, and both fixes.
    """
    if not cls._actorch_plain:
        return
    names = ", ".join(f"{cls.__qualname__}.{name}" for name in cls._actorch_plain)
    first = cls._actorch_plain[0]
    verb = "is a plain `def` method" if len(cls._actorch_plain) == 1 else "are plain `def` methods"
    raise TypeError(
        f"cannot spawn {cls.__qualname__}: {names} {verb}, "
        f"and only `async def` methods are endpoints callers can reach: make it `async def {first}(...)` (run "
        f"blocking work in it with `await asyncio.to_thread(...)`), or, if only the actor itself calls it, "
        f"make it private (`_{first}`)"
    )


def endpoints_of(cls: type[Actor]) -> dict[str, Endpoint]:
    """The endpoints of an actor class, by name."""
    return cls._actorch_endpoints


def class_path(cls: type) -> str:
    """The importable path of a class, ``module:Qualname``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def attach(instance: Actor, ref: ActorRef[Any], system: ActorSystem) -> None:
    """Give a new actor instance its ref and its node's system, before its ``__init__`` runs."""
    instance._actorch_ref = ref
    instance._actorch_system = system


def place(instance: Actor, device: torch.device | None) -> None:
    """Give a new actor instance the device it was spawned on (None: its class's), before its ``__init__`` runs."""
    if device is not None:
        instance.device = device
