"""A node's ``setup`` function, in the two forms it takes: of the node's rank, or of its system.

``run`` and ``start`` call their ``setup`` with the rank before the node
serves; ``serve`` also takes one that asks for the system, called once the
node has joined. ``takes_system`` tells them apart, by the first parameter.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from actorch._actors.system import ActorSystem

__all__ = ["Setup", "SystemSetup", "takes_system"]

Setup = Callable[[int], object]
"""A function run on every node with its rank before the node serves (may return an awaitable)."""

SystemSetup = Callable[[ActorSystem], object]
"""A ``serve`` setup that asks for the node's system: run once the node has joined (may return an awaitable)."""


def takes_system(setup: Callable[..., object]) -> bool:
    """Whether ``setup`` asks for the node's system: its first parameter is named ``system`` or annotated so."""
    try:
        parameters = list(inspect.signature(setup).parameters.values())
    except (TypeError, ValueError):  # a callable without a signature takes the rank, as always
        return False
    if not parameters:
        return False
    first = parameters[0]
    annotation = first.annotation
    named = annotation.rpartition(".")[2] if isinstance(annotation, str) else getattr(annotation, "__name__", None)
    return first.name == "system" or annotation is ActorSystem or named == "ActorSystem"
