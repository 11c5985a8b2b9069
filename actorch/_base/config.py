"""The settings every node of a system shares, declared and validated in one place.

``actorch.run`` and ``actorch.testing.local_world`` take them as keyword
options and build one :class:`SystemConfig`; the layers above read it and never
check a value again. The predicates here are also what other options of the
runtime (``@batched``, ``Restart``, ``max_concurrency``) are checked with.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from actorch._base.channels.leases import DEFAULT_SHM_POOL
from actorch._base.channels.plane import check_channels
from actorch._base.record import is_run_id

__all__ = [
    "DEFAULT_MAILBOX_SIZE",
    "DEFAULT_MAX_MESSAGE",
    "DEFAULT_SEND_BUDGET",
    "DEFAULT_SNAPSHOTS_KEPT",
    "DEVICES_POLICIES",
    "SystemConfig",
    "is_count",
    "is_number",
]

DEFAULT_MAILBOX_SIZE = 4096
"""Messages one node may have waiting at one actor, unless the system says otherwise."""

DEFAULT_MAX_MESSAGE = 1 << 30
"""Bytes a message between nodes may take (msgpack body and tensors), unless the system says otherwise."""

DEFAULT_SEND_BUDGET = 256 << 20
"""Bytes one node may have on their way to another (not yet taken there), unless the system says otherwise."""

DEVICES_POLICIES = ("stage", "strict")
"""What ``devices`` takes: stage a GPU tensor no direct path carries through host memory, or refuse it."""

DEFAULT_SNAPSHOTS_KEPT = 2
"""Snapshot files kept per actor in a snapshot directory: the newest, and one to fall back on if it is unreadable."""


def is_count(value: object, minimum: int = 1) -> bool:
    """Whether ``value`` is an int (not a bool) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def is_number(value: object, minimum: float = 0.0, *, inclusive: bool = True) -> bool:
    """Whether ``value`` is a finite number (not a bool) above ``minimum``, or equal to it if ``inclusive``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value >= minimum if inclusive else value > minimum


@dataclass(frozen=True)
class SystemConfig:
    """Settings shared by every node of a system.

    Attributes:
        strict: Refuse values that would need pickle (``SerializationError``).
        lookup_timeout: Seconds ``lookup`` waits for a name when no deadline is set.
        stop_grace: Seconds a stopping actor's queued and running messages may
            take before they are cancelled, and again its ``on_stop``.
        mailbox_size: Messages one node may have waiting at one actor.
        max_message_size: Bytes a message between nodes may take.
        send_budget: Bytes one node may have on their way to one other node
            (sent, not yet taken there); past it a tell raises
            ``MailboxFullError`` and a call waits for them to drain.
        run_record: The run's id, under which every node writes its record of
            the run (``actorch history``); None: no record.
        otel: Make every call, tell and stream through a ref, and every
            handler run, an OpenTelemetry span, the context carried across
            nodes (needs ``actorch[otel]``).
        devices: What happens to a GPU tensor no direct path carries to its
            destination: ``"stage"`` copies it through host memory,
            ``"strict"`` refuses it (``SerializationError``).
        channels: The tensor channels a node may use beyond those always
            there (``channels.plane.OPTIONAL``); None: every one.
        shm_pool: Bytes of shared memory each node keeps at most for the
            tensors it sends to nodes of its host and its leases.
        snapshots: The directory (an absolute path) where rank 0 writes the
            snapshots of named relocatable actors, and where a new system
            finds them by name; None: snapshots live in rank 0's memory only.
            Every node knows it, so that a node building such an actor asks
            rank 0 for its last snapshot; only rank 0 reads and writes it.
        snapshots_kept: Snapshot files kept per actor in that directory: a
            newer one that cannot be read falls back on the one before.
    """

    strict: bool = False
    lookup_timeout: float = 30.0
    stop_grace: float = 10.0
    mailbox_size: int = DEFAULT_MAILBOX_SIZE
    max_message_size: int = DEFAULT_MAX_MESSAGE
    send_budget: int = DEFAULT_SEND_BUDGET
    run_record: str | None = None
    otel: bool = False
    devices: str = "stage"
    channels: tuple[str, ...] | None = None
    shm_pool: int = DEFAULT_SHM_POOL
    snapshots: str | None = None
    snapshots_kept: int = DEFAULT_SNAPSHOTS_KEPT

    def __post_init__(self) -> None:
        for field in ("lookup_timeout", "stop_grace"):
            if not is_number(getattr(self, field)):
                raise ValueError(f"{field} must be a finite number of seconds >= 0, not {getattr(self, field)!r}")
        object.__setattr__(self, "channels", check_channels(self.channels))
        for field in ("mailbox_size", "max_message_size", "send_budget", "shm_pool", "snapshots_kept"):
            if not is_count(getattr(self, field)):
                raise ValueError(f"{field} must be an int >= 1, not {getattr(self, field)!r}")
        if not isinstance(self.otel, bool):
            raise ValueError(f"otel must be True or False, not {self.otel!r}")
        if self.devices not in DEVICES_POLICIES:
            raise ValueError(f"devices must be 'stage' or 'strict', not {self.devices!r}")
        if self.snapshots is not None and not (isinstance(self.snapshots, str) and os.path.isabs(self.snapshots)):
            raise ValueError(f"snapshots must be an absolute directory path or None, not {self.snapshots!r}")
        if self.run_record is not None and not is_run_id(self.run_record):
            raise ValueError(
                f"run_record must be a run id (letters, digits, '.', '_', '-'; at most 128) or None, "
                f"not {self.run_record!r}"
            )
