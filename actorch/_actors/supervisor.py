"""Supervision on one node: restarting actors that failed, and remembering how actors ended.

A handler that raises one of its class's ``fatal_errors`` fails the actor. Its
node pauses it (calls queued or running get ``ActorStoppedError``, new calls
wait), runs its ``on_stop``, takes its ``snapshot()`` if the class keeps state,
and then, if the actor was spawned with a ``Restart`` policy that allows it,
builds a new instance in the same cell after the policy's backoff: same node,
same id, same name, so every ref keeps working. Without a policy, or once the
policy's restarts are used up, the actor stops for good.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actorch._actors.actor import Actor, has_state_hooks
from actorch._actors.restart import ActorExit, Restart
from actorch._engine.node import CANCEL_WAIT
from actorch._engine.wire import describe

if TYPE_CHECKING:
    from actorch._actors.system import ActorSystem
    from actorch._engine.cell import Cell

__all__ = ["Supervisor"]

EXITS_KEPT = 4096
"""How many ended actors a node remembers, for ``wait_stopped`` calls that come late."""


@dataclass(frozen=True)
class _Spec:
    """What rebuilding an actor takes."""

    cls: type[Actor]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    restart: Restart


class Supervisor:
    """Restarts this node's failed actors and keeps how its actors ended."""

    def __init__(self, system: ActorSystem) -> None:
        self._system = system
        self._specs: dict[int, _Spec] = {}
        self._failures: dict[int, deque[float]] = {}
        self._exits: OrderedDict[int, ActorExit] = OrderedDict()
        self._waiters: dict[int, list[asyncio.Future[ActorExit]]] = {}
        system._node.on_actor_failed(self._on_failure)

    def __repr__(self) -> str:
        return f"<Supervisor node {self._system.rank} supervised={len(self._specs)} ended={len(self._exits)}>"

    def adopt(
        self, actor_id: int, cls: type[Actor], args: tuple[Any, ...], kwargs: dict[str, Any], restart: Restart
    ) -> None:
        """Restart actor ``actor_id`` by ``restart`` when it fails, rebuilding it from these arguments."""
        self._specs[actor_id] = _Spec(cls, args, dict(kwargs), restart)

    # ------------------------------------------------------------------ failures

    def _on_failure(self, cell: Cell, error: BaseException, cancelled: list[asyncio.Task[Any]]) -> None:
        task = self._system._node.loop.create_task(self._recover(cell, error, cancelled))
        cell.tasks.add(task)  # a stop or a shutdown cancels the recovery like any handler
        task.add_done_callback(cell.tasks.discard)

    async def _recover(self, cell: Cell, error: BaseException, cancelled: list[asyncio.Task[Any]]) -> None:
        system = self._system
        node = system._node
        grace = system.config.stop_grace
        cause = describe(error)
        node.log.error(
            "actor failed",
            actor=cell.label,
            error=cause,
            restarts=cell.restarts,
            traceback="".join(traceback.format_exception(error)),
        )
        if cancelled:
            await asyncio.wait(cancelled, timeout=CANCEL_WAIT)
        spec = self._specs.get(cell.actor_id)
        kept: tuple[Any] | None = None
        if spec is not None and has_state_hooks(spec.cls):
            try:
                kept = (await system._run_hook(cell, "snapshot", raise_errors=True, limit=grace),)
            except Exception as exc:  # noqa: BLE001 - the restart goes on from a fresh instance
                node.log.warning(
                    "snapshot failed; the new instance starts fresh", actor=cell.label, error=describe(exc)
                )
        await system._run_hook(cell, "on_stop", limit=grace)
        while True:
            if spec is None:
                await self._give_up(cell, cause, "it has no restart policy")
                return
            failures = self._count_failure(cell.actor_id, spec.restart)
            if failures > spec.restart.max_restarts:
                await self._give_up(cell, cause, f"{failures - 1} restarts were used up")
                return
            await asyncio.sleep(spec.restart.delay(failures))
            try:
                await system._start_instance(cell, spec.cls, spec.args, spec.kwargs, kept)
            except Exception as exc:  # noqa: BLE001 - a failed restart is one more failure
                cause = describe(exc)
                node.log.error("restart failed", actor=cell.label, error=cause, attempt=failures)
                continue
            cell.restarts += 1
            node.resume(cell)
            node.log.info("actor restarted", actor=cell.label, restarts=cell.restarts, after=failures)
            return

    def _count_failure(self, actor_id: int, restart: Restart) -> int:
        """Record a failure now; how many count against ``restart`` (this one included)."""
        now = time.monotonic()
        history = self._failures.setdefault(actor_id, deque())
        history.append(now)
        if restart.within is not None:
            while history and history[0] < now - restart.within:
                history.popleft()
        return len(history)

    async def _give_up(self, cell: Cell, cause: str, why: str) -> None:
        self._system._node.log.error("actor stopped after failing", actor=cell.label, error=cause, why=why)
        await self._system._stop_cell(cell, ActorExit("failed", cause))

    # ------------------------------------------------------------------ exits

    def ended(self, actor_id: int, exit_: ActorExit) -> None:
        """Record how actor ``actor_id`` ended and wake whoever waits for it."""
        self._specs.pop(actor_id, None)
        self._failures.pop(actor_id, None)
        self._exits[actor_id] = exit_
        while len(self._exits) > EXITS_KEPT:
            self._exits.popitem(last=False)
        for waiter in self._waiters.pop(actor_id, ()):
            if not waiter.done():
                waiter.set_result(exit_)

    async def wait_stopped(self, actor_id: int) -> ActorExit:
        """How actor ``actor_id`` of this node ended, once it has."""
        known = self._exits.get(actor_id)
        if known is not None:
            return known
        if self._system._node.cell(actor_id) is None and actor_id not in self._system._stopping:
            return ActorExit("stopped", f"node {self._system.rank} hosts no actor #{actor_id} any more")
        waiter: asyncio.Future[ActorExit] = self._system._node.loop.create_future()
        waiters = self._waiters.setdefault(actor_id, [])
        waiters.append(waiter)
        try:
            return await waiter
        finally:
            if waiter in waiters:
                waiters.remove(waiter)

    def close(self) -> None:
        """The node shuts down: whoever still waits hears so."""
        waiting, self._waiters = self._waiters, {}
        for waiters in waiting.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(ActorExit("shutdown"))
