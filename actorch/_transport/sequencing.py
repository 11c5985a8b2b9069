"""Link order: a sequence number per link, and bundles that came by two lanes put back in send order.

A node sends each peer bundles on two lanes (the fast lane, ``lane``, and the
transport's main path), and a main path whose threads hand bundles over may
deliver them out of order too. So every bundle carries its link's next
sequence number, one sequence for both lanes, and the receiver takes a bundle
when its turn comes, holding those that came early. What one peer has held
waiting is bounded by ``HELD_BUDGET``: a bundle that never comes (its lane
broke) would otherwise hold every later one forever, so past the budget the
peer counts as lost.

Nothing here knows torch or sockets: a bundle's payload is whatever the
transport carries with it (for torch RPC, its response to answer on). Every
method runs on the node's loop; :meth:`LinkOrder.arrived` is on the path of
every bundle received, so it stays lean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["HELD_BUDGET", "LinkOrder"]

HELD_BUDGET = 256 << 20
"""Bytes of bundles one peer may have waiting for an earlier one (lane and main path reordered); past it, it is lost."""

P = TypeVar("P")


class LinkOrder(Generic[P]):
    """The sequence numbers of a node's links, and the bundles held until their turn.

    ``deliver(src, payload)`` takes each bundle in its link's order;
    ``size_of(payload)`` says how many bytes a held one counts against the budget.
    """

    __slots__ = ("_deliver", "_size_of", "expected", "held", "held_bytes", "next_seq")

    def __init__(self, deliver: Callable[[int, P], None], size_of: Callable[[P], int]) -> None:
        self._deliver = deliver
        self._size_of = size_of
        self.next_seq: dict[int, int] = {}
        """Per peer, the number of the next bundle sent to it; the sender reads and advances it (a bundle sent)."""
        self.expected: dict[int, int] = {}
        """Per peer, the number of the next bundle to take from it."""
        self.held: dict[int, dict[int, P]] = {}
        """Per peer, bundles that came before their turn, by number."""
        self.held_bytes: dict[int, int] = {}
        """Per peer, the bytes of the bundles in ``held``."""

    def __repr__(self) -> str:
        return f"<LinkOrder links={len(self.next_seq)} held={sum(map(len, self.held.values()))}>"

    def meet(self, rank: int) -> None:
        """Open the link with ``rank``, numbered from 0 both ways (a link already open stays as it is)."""
        self.next_seq.setdefault(rank, 0)
        self.expected.setdefault(rank, 0)
        self.held.setdefault(rank, {})

    def forget(self, rank: int) -> list[P]:
        """Stop holding bundles from ``rank`` (it left); those it held, to answer."""
        dropped = list(self.held.pop(rank, {}).values())
        self.held_bytes.pop(rank, None)
        return dropped

    def drop_held(self, rank: int) -> list[P]:
        """Let go of the bundles held from ``rank`` (it is lost); those it held, to answer."""
        held = self.held.get(rank, {})
        dropped = list(held.values())
        held.clear()
        self.held_bytes.pop(rank, None)
        return dropped

    def arrived(self, src: int, seq: int, payload: P) -> str | None:
        """Take bundle ``seq`` from ``src``: deliver it and those it frees if its turn came, else hold it.

        Returns:
            None, or why ``src`` is lost: holding this bundle would pass
            ``HELD_BUDGET`` (it is neither delivered nor held then).
        """
        held = self.held[src]
        if seq != self.expected[src]:
            held_bytes = self.held_bytes.get(src, 0) + self._size_of(payload)
            if held_bytes > HELD_BUDGET:
                return f"{held_bytes:,} bytes of bundles waited for bundle {self.expected[src]}, which never came"
            self.held_bytes[src] = held_bytes
            held[seq] = payload
            return None
        deliver = self._deliver
        while True:
            deliver(src, payload)
            seq += 1
            if seq not in held:
                break
            payload = held.pop(seq)
            self.held_bytes[src] -= self._size_of(payload)
        self.expected[src] = seq
        return None
