"""Public homes: a public module claims the classes and functions it exports, so they print as users import them.

Objects are defined in private modules (``actorch._stock.replay``) and exported
from public ones (``actorch.replay``); their ``__module__`` is set to the
public one so that reprs, tracebacks, pickles and the API reference name them
``actorch.replay.ReplayBuffer``. An object another public module claimed
first keeps that home (``actorch.ReplayBuffer`` is ``actorch.replay``'s).
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping

__all__ = ["claim"]


def claim(home: str, names: Iterable[str], namespace: Mapping[str, object]) -> None:
    """Make module ``home`` the home of the classes and functions it exports (``names``, found in ``namespace``).

    Only objects still homed in a private module (``actorch._...``) are
    claimed, so the first public module to export an object keeps it.
    """
    for name in names:
        public = namespace[name]
        if isinstance(public, (type, types.FunctionType)) and public.__module__.startswith("actorch._"):
            public.__module__ = home
