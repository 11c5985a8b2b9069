"""Where a log line was written: a structlog processor naming the node, actor, endpoint and call it came from.

A handler's own log lines (a user's actor logging through structlog, a
stock actor's warning) are written far from the runtime that ran them. This
processor reads the call being served, which the engine sets for every
handler run anyway, so nothing is bound per call and a line costs only when
it is written. ``actorch.run`` puts it in the configuration it makes; a
program that configures structlog itself adds ``actorch.add_call_context``
to its processors.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from actorch._engine.message import current_call

__all__ = ["add_call_context"]


def add_call_context(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Add ``node``, ``actor``, ``endpoint`` and ``call`` of the handler running now; keys already given win.

    Outside any handler (a script's ``main``, the runtime's own tasks) the
    event is left as it is. ``call`` is the call's key as ``actorch status``
    and the runtime's own log lines print it (``0x...``).
    """
    context = current_call.get()
    if context is None:
        return event_dict
    event_dict.setdefault("node", context.node)
    event_dict.setdefault("actor", context.label)
    event_dict.setdefault("endpoint", context.endpoint)
    event_dict.setdefault("call", f"{context.key:#x}")
    return event_dict
