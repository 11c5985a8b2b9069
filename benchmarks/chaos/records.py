"""The values that cross nodes: a ledger's answer, a node's count of another as lost, what a sink received.

Their codes (90 to 92) are taken by no test and no docs page: the suite imports this module beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import actorch


@actorch.serializable(90)
@dataclass
class Entry:
    """A ledger's answer to an addition.

    Attributes:
        value: Its count after the addition.
        incarnation: Which instance answered (a new one after each relocation).
        restored_from: The count it was restored from (None: it started fresh).
        intact: Whether the restored tensor agreed with the restored count.
        rank: The node it lives on.
    """

    value: int
    incarnation: str
    restored_from: int | None
    intact: bool
    rank: int


@actorch.serializable(91)
@dataclass
class Loss:
    """A node counted another lost: ``by`` counted ``peer`` lost at ``at`` (``time.time()``), saying ``why``."""

    by: int
    peer: int
    why: str
    at: float


@actorch.serializable(92)
@dataclass
class Seen:
    """What a sink received from one sender: the last number, and numbers missing or repeated on the way."""

    last: int
    gaps: int
    repeats: int
