"""How a process asks to join an elastic world, and how rank 0 answers: a protocol over the rendezvous store.

Nothing here touches torch RPC; ``elastic`` does. The keys live under the
world's store prefix:

- ``elastic``: set once rank 0 accepts newcomers; ``ranks`` counts the ranks
  handed out (a newcomer takes the next with an atomic add, so ranks are never
  reused);
- ``join/<rank>``: the request (host, pid, devices, label, and a proof of the token),
  then ``bell/<n>`` for the ``n``-th request (``bells`` counts them), which
  wakes rank 0's admission thread: it waits on the next bell rather than polling;
- ``admit/<rank>``: rank 0's answer (refused with why, or admitted with the members);
- ``up/<rank>``: the newcomer's torch RPC agent is up;
- ``ready/<rank>``: every member knows it; it may watch them and serve;
- ``closing``: the system is shutting down (pending requests are refused).

The token itself never enters the store: a request carries an HMAC of its own
rank, host and pid under the token.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from actorch._base.channels.plane import own_reach
from actorch._base.errors import JoinError
from actorch._transport.base import NodeInfo, NodeTraits
from actorch._transport.suspicion import own_process

__all__ = [
    "ADDRESS_ENV",
    "TOKEN_ENV",
    "JoinRequest",
    "Membership",
    "new_token",
    "parse_address",
]

ADDRESS_ENV = "ACTORCH_ADDRESS"
"""Environment variable with an elastic system's address (``host:port`` of rank 0's store)."""
TOKEN_ENV = "ACTORCH_JOIN_TOKEN"  # noqa: S105 - the variable's name, not a secret
"""Environment variable with an elastic system's join token (never on the command line)."""
POLL = 0.05
"""Seconds between two looks at the store while a newcomer waits for a key (only while it joins)."""
PRIVATE = "private"
"""The ``elastic`` key's value in a system that takes only the processes it starts itself."""
BELL_WAIT = 1.0
"""Seconds rank 0's admission thread waits for the next bell before it looks again (and at whether to stop)."""


def new_token() -> str:
    """A fresh random join token."""
    return secrets.token_urlsafe(24)


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) as a pair; ``ValueError`` if it is not one."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"an actorch address is host:port, not {address!r}")
    return host, int(port)


def _proof(token: str, rank: int, host: str, pid: int) -> str:
    return hmac.new(token.encode(), f"join|{rank}|{host}|{pid}".encode(), hashlib.sha256).hexdigest()


def facts_of(info: NodeInfo) -> dict[str, Any]:
    """What the store carries of a node (json-ready)."""
    return {
        "rank": info.rank,
        "host": info.host,
        "pid": info.pid,
        "devices": list(info.devices),
        "label": info.label,
        "resources": dict(info.resources),
        "owner": info.owner,
        "parent": info.parent,
        "pool": info.pool,
        "lane": info.lane,
        "process": info.process,
        "reach": dict(info.reach),
    }


def info_of(facts: dict[str, Any]) -> NodeInfo:
    """The node ``facts_of`` described."""
    rank = int(facts["rank"])
    return NodeInfo(
        rank,
        f"node{rank}",
        facts["host"],
        int(facts["pid"]),
        tuple(facts["devices"]),
        facts["label"],
        {str(name): float(amount) for name, amount in facts.get("resources", {}).items()},
        facts.get("owner"),
        facts.get("parent"),
        bool(facts.get("pool", False)),
        facts.get("lane"),
        facts.get("process"),
        {str(key): str(value) for key, value in (facts.get("reach") or {}).items()},
    )


@dataclass(frozen=True)
class JoinRequest:
    """A newcomer's request to join, as rank 0 reads it."""

    info: NodeInfo
    proof: str

    def verify(self, token: str) -> bool:
        """Whether the request proves it holds ``token``."""
        expected = _proof(token, self.info.rank, self.info.host, self.info.pid)
        return hmac.compare_digest(expected, self.proof)


class Membership:
    """The join protocol's keys in one world's (prefixed) store."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __repr__(self) -> str:
        return "<Membership>"

    # ---------------------------------------------------------------- rank 0

    def open(self, initial: int, shared: dict[str, Any], *, public: bool = True) -> None:
        """Accept newcomers: ranks below ``initial`` are the launch's own; newcomers get the next ones.

        ``shared`` holds the settings every node of the system runs with
        (json-ready). A system that is not ``public`` takes only the processes
        it starts itself (``add_nodes``); others hear that it takes no new nodes.
        """
        self._store.add("ranks", initial)
        self._store.set("settings", json.dumps(shared))
        self._store.set("elastic", "1" if public else PRIVATE)

    def settings(self) -> dict[str, Any]:
        """The settings every node runs with, as rank 0 published them."""
        found: dict[str, Any] = json.loads(bytes(self._store.get("settings")).decode())
        return found

    def wait_bell(self, bell: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for request number ``bell`` (from 1); whether it rang."""
        key = f"bell/{bell}"
        if self._store.check([key]):
            return True
        try:
            self._store.wait([key], timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001 - torch's store raises its own error type on a timeout
            return bool(self._store.check([key]))
        return True

    def handed_out(self) -> int:
        """How many ranks have been handed out so far."""
        return int(self._store.add("ranks", 0))

    def request(self, rank: int) -> JoinRequest | None:
        """Rank ``rank``'s request, if it has asked yet."""
        if not self._store.check([f"join/{rank}"]):
            return None
        facts = json.loads(bytes(self._store.get(f"join/{rank}")).decode())
        return JoinRequest(info_of(facts), str(facts.get("proof", "")))

    def answer(self, rank: int, why_refused: str | None, members: Sequence[NodeInfo] = ()) -> None:
        """Admit rank ``rank`` with the current ``members``, or refuse it saying why."""
        if why_refused is not None:
            answer: dict[str, Any] = {"ok": False, "why": why_refused}
        else:
            answer = {"ok": True, "members": [facts_of(info) for info in members]}
        self._store.set(f"admit/{rank}", json.dumps(answer))

    def is_up(self, rank: int) -> bool:
        """Whether rank ``rank``'s agent is up."""
        return bool(self._store.check([f"up/{rank}"]))

    def ready(self, rank: int) -> None:
        """Every member knows rank ``rank``: it may start."""
        self._store.set(f"ready/{rank}", "1")

    def is_ready(self, rank: int) -> bool:
        """Whether rank ``rank`` was told it may start."""
        return bool(self._store.check([f"ready/{rank}"]))

    def close(self) -> None:
        """The system is shutting down: newcomers still waiting are refused."""
        self._store.set("closing", "1")

    # ---------------------------------------------------------------- a newcomer

    def wait_elastic(self, timeout: float, *, invited: bool = False) -> None:
        """Wait (up to ``timeout`` s, for a system still starting) until the world accepts newcomers.

        ``invited``: this process was started by the system itself, which a
        system that is not elastic takes too.

        Raises:
            JoinError: It does not: a static world, or not actorch's.
        """
        refused = "the system does not accept new nodes (start it with elastic=True)"
        self._wait_for("elastic", timeout, refused)
        if not invited and bytes(self._store.get("elastic")).decode() == PRIVATE:
            raise JoinError(refused)

    def take_rank(self) -> int:
        """A fresh rank for this process: one never handed out before."""
        return int(self._store.add("ranks", 1)) - 1

    def ask(self, info: NodeInfo, token: str | None) -> None:
        """Ask to join as ``info``, proving the token (an empty proof without one)."""
        proof = "" if not token else _proof(token, info.rank, info.host, info.pid)
        self._store.set(f"join/{info.rank}", json.dumps({**facts_of(info), "proof": proof}))
        self.ring()

    def ring(self) -> None:
        """Ring the next bell: rank 0's admission thread wakes and looks at the requests (and whether to stop)."""
        self._store.set(f"bell/{int(self._store.add('bells', 1))}", "1")

    def wait_answer(self, rank: int, timeout: float) -> list[NodeInfo]:
        """The members to meet once admitted.

        Raises:
            JoinError: Refused (with rank 0's reason), the system is shutting
                down, or no answer came within ``timeout`` seconds.
        """
        self._wait_for(f"admit/{rank}", timeout, "rank 0 did not answer the request to join")
        answer = json.loads(bytes(self._store.get(f"admit/{rank}")).decode())
        if not answer["ok"]:
            raise JoinError(f"the system refused this node: {answer['why']}")
        return [info_of(facts) for facts in answer["members"]]

    def up(self, rank: int) -> None:
        """This newcomer's agent is up: rank 0 may introduce it to the members."""
        self._store.set(f"up/{rank}", "1")

    def wait_ready(self, rank: int, timeout: float) -> None:
        """Wait until every member knows this newcomer (``JoinError`` past ``timeout`` or on shutdown)."""
        self._wait_for(f"ready/{rank}", timeout, "the members were not told of this node in time")

    def _wait_for(self, key: str, timeout: float, why: str) -> None:
        limit = time.monotonic() + timeout
        try:
            while not self._store.check([key]):
                if key != "elastic" and self._store.check(["closing"]):
                    raise JoinError("the system is shutting down")
                if time.monotonic() >= limit:
                    raise JoinError(f"{why} within {timeout:g} s")
                # Returns the moment the key is set, so a join waits no polling interval per step. It raises
                # when its timeout passes; a store that is gone fails the check above.
                with contextlib.suppress(Exception):
                    self._store.wait([key], timedelta(seconds=POLL))
        except JoinError:
            raise
        except Exception as exc:  # the store went with rank 0
            raise JoinError(f"lost the system's store while joining: {exc}") from exc


def own_info(rank: int, devices: Sequence[str], traits: NodeTraits, lane: str | None = None) -> NodeInfo:
    """This process as a node of rank ``rank`` (its fast lane listening at ``lane``, if it has one)."""
    info = traits.info(rank, socket.gethostname(), os.getpid(), tuple(devices), lane)
    # Peers on this machine can then look at it (``suspicion``), and choose the channels that reach it.
    return replace(info, process=own_process(), reach=own_reach())
