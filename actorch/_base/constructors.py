"""Classes whose objects only the runtime makes: calling the class raises, the runtime calls ``_create``.

Refs and systems are made by the runtime, wired to its nodes; one built by
hand would have no node behind it. Their classes take :class:`NoPublicConstructor`
as metaclass: ``ActorRef()`` raises ``TypeError`` saying how such objects are
obtained, and the runtime makes them with ``ActorRef._create(...)``, which runs
``__init__`` as usual.
"""

from __future__ import annotations

from abc import ABCMeta
from typing import Any, NoReturn, TypeVar

__all__ = ["NoPublicConstructor", "NoPublicConstructorABC"]

T = TypeVar("T")


class NoPublicConstructor(type):
    """Metaclass of classes without a public constructor: the class's ``_made_by`` says how objects are obtained."""

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        made_by = getattr(cls, "_made_by", "the runtime")
        raise TypeError(f"{cls.__qualname__} objects are made by {made_by}")

    def _create(cls: type[T], *args: Any, **kwargs: Any) -> T:
        """A new object of the class, built by its ``__init__``: the runtime's way to make one."""
        return type.__call__(cls, *args, **kwargs)  # type: ignore[no-any-return]


class NoPublicConstructorABC(NoPublicConstructor, ABCMeta):
    """``NoPublicConstructor`` for abstract classes: users meet the refusal, not the list of abstract methods."""
