"""Import paths of the stock actors' factories, resolved on the node that builds the actor.

A strict system sends no callables or classes, so the stock actors
(:class:`~actorch.ParameterServer`, :class:`~actorch.Agent`,
:class:`~actorch.Observer`) take a model factory, an environment factory or an
optimizer class either as the object itself or as its import path
(``"package.module:factory"`` or ``"torch.optim.Adam"``). The standard library's
:func:`pkgutil.resolve_name` does the import; this module only turns its
failures into the ``ValueError`` those actors document, naming what was sought.
"""

from __future__ import annotations

import pkgutil
from typing import Any

__all__ = ["resolve"]


def resolve(target: Any, what: str) -> Any:
    """``target`` itself, or the object its import path names.

    Args:
        target: An object, or its path as ``"module:qualname"`` or ``"module.name"``.
        what: What ``target`` should be, for the error message (``"optimizer"``).

    Raises:
        ValueError: If ``target`` is a path that does not resolve.
    """
    if not isinstance(target, str):
        return target
    try:
        return pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot import the {what} {target!r}: {exc}") from exc
