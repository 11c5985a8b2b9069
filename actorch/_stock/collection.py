"""``Collection``: the learner's end of many collectors, their batches as one async iterator.

The learner reads ``async for batch in collection``, first ready first served
(the oldest version first when several are), and publishes its weights to
every collector in one broadcast (each node receives them once, whatever its
number of collectors). Each batch carries the version of the weights that
made it, and the collection can bound how far behind the learner's own
version a batch may be (``max_lag``):

- ``on_lag="drop"``: collectors stream freely, each up to ``window`` batches
  ahead; a batch more than ``max_lag`` versions old when the learner takes it
  is dropped.
- ``on_lag="wait"``: collectors collect only when asked, one batch at a time,
  and wait for weights no more than ``max_lag`` versions older than the
  learner's before they start; a batch that still falls behind (the learner
  moved on while it was made) is asked for again.

Either way no batch the learner takes is more than ``max_lag`` versions old.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from typing import Any, Literal

import structlog
import torch
from torch import nn

from actorch._actors.ref import ActorRef
from actorch._engine.streaming import Stream
from actorch._stock.batch import Batch
from actorch._stock.collector import Collector
from actorch._stock.group import ActorGroup
from actorch._stock.handover import Handover
from actorch._stock.heap import keep_freed_memory

__all__ = ["Collection"]

log = structlog.get_logger("actorch")

LagPolicy = Literal["drop", "wait"]


class _Source:
    """One collector as the collection reads it: its ref, and the batch being waited for."""

    __slots__ = ("pending", "ready_at", "ref", "stream", "taken")

    def __init__(self, ref: ActorRef[Collector]) -> None:
        self.ref = ref
        self.stream: Stream[Batch] | None = None
        self.pending: asyncio.Task[Batch] | None = None
        self.ready_at = 0  # when the pending batch came, in the collection's count: the first ready is served first
        self.taken = 0


class Collection:
    """Batches from many :class:`~actorch.Collector` s as one ``async for``, and their weights kept in sync.

    Use it as an async context manager (or call :meth:`aclose`): leaving it
    closes the streams, so each collector gives up the batch it was playing
    and waits, alive and idle, for its next reader; with
    ``stop_collectors=True`` it stops them too. Iteration ends when no
    collector is left; a collector that fails is left out, and its error is
    raised once from the iteration (with a note naming it), which may go on.

    Collectors on the learner's host (in other processes) hand their batches
    over through shared memory: the observations are written once, by the
    collector, and copied once, into the learner's batch. Others send them
    by value, and so does a collector whose ``/dev/shm`` is full (it warns
    once). Like a collector's, the learner's process then keeps the memory
    it frees for the next batches (glibc's malloc thresholds, unless set
    through ``MALLOC_*_`` or ``GLIBC_TUNABLES``), rather than fault in the
    megabytes of each batch's copy afresh.

    Args:
        collectors: The collectors' refs (``await system.lookup_all("rl/collectors/*")``).
        max_lag: The most versions a batch may be behind :attr:`version` when
            the learner takes it; None: any.
        on_lag: What happens to a batch past ``max_lag``: ``"drop"`` or
            ``"wait"`` (see the module's documentation).
        window: How many batches each collector may be ahead of the learner
            (``"wait"`` asks for one at a time). 2 keeps a collector playing
            while its last batch travels and waits to be taken, for
            throughput; 1 keeps batches a version fresher.
        version: The learner's version to start from.
        server: A :class:`~actorch.ParameterServer` the collectors pull
            newer weights from before each batch, instead of :meth:`publish`.
        stop_collectors: Stop the collectors when the collection closes.
        shared_memory: Let collectors on this host hand batches over through
            shared memory; False sends every batch by value, over the
            transport (with ``transport="shm"``, TensorPipe's own shared
            memory), for a host whose ``/dev/shm`` is small.

    Raises:
        ValueError: If there are no collectors, ``max_lag`` is negative,
            ``on_lag`` is neither ``"drop"`` nor ``"wait"`` (or ``"wait"``
            without a ``max_lag``), or ``window`` is below 1.
    """

    def __init__(
        self,
        collectors: Iterable[ActorRef[Collector]],
        *,
        max_lag: int | None = None,
        on_lag: LagPolicy = "drop",
        window: int = 1,
        version: int = 0,
        server: ActorRef[Any] | None = None,
        stop_collectors: bool = False,
        shared_memory: bool = True,
    ) -> None:
        refs = list(collectors)
        if not refs:
            raise ValueError("a collection needs at least one collector")
        if max_lag is not None and (not isinstance(max_lag, int) or isinstance(max_lag, bool) or max_lag < 0):
            raise ValueError(f"max_lag must be an int >= 0 or None, not {max_lag!r}")
        if on_lag not in ("drop", "wait"):
            raise ValueError(f"on_lag must be 'drop' or 'wait', not {on_lag!r}")
        if on_lag == "wait" and max_lag is None:
            raise ValueError("on_lag='wait' needs a max_lag: it is the lag the collectors wait to stay within")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"window must be an int >= 1, not {window!r}")
        self.max_lag = max_lag
        self.on_lag = on_lag
        self.window = window
        self.version = version
        """The learner's version: :meth:`publish` moves it; set it yourself when weights travel another way."""
        self.server = server
        self.stop_collectors = stop_collectors
        self.shared_memory = shared_memory
        keep_freed_memory()  # a batch that comes by value takes the megabytes the last one freed
        self._refs = refs
        self._sources = [_Source(ref) for ref in refs]
        self._arrivals = itertools.count()
        self._last: _Source | None = None  # the source of the batch handed out last (asked again lazily)
        self._closed = False
        self._unpublished_said = False
        self._counts = {"batches": 0, "frames": 0, "dropped": 0, "asked_again": 0, "failed": 0, "published": 0}

    def __repr__(self) -> str:
        return f"<Collection collectors={len(self._sources)} version={self.version} max_lag={self.max_lag}>"

    async def __aenter__(self) -> Collection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[Batch]:
        return self

    async def __anext__(self) -> Batch:
        """The next batch within ``max_lag``: the oldest version first among those ready, then the first ready."""
        if self._closed:
            raise StopAsyncIteration
        if self._last is not None:
            self._arm(self._last)
            self._last = None
        while True:
            for source in self._sources:
                if source.pending is None:
                    self._arm(source)
            if not self._sources:
                raise StopAsyncIteration
            pending = [source.pending for source in self._sources if source.pending is not None]
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            ready = [source for source in self._sources if source.pending is not None and source.pending.done()]
            source = min(ready, key=_age)
            batch = self._take(source)
            if batch is None:  # it made all it was asked for
                continue
            if self._stale(batch):
                self._counts["dropped" if self.on_lag == "drop" else "asked_again"] += 1
                log.debug("stale batch set aside", collector=batch.collector, version=batch.version, at=self.version)
                self._arm(source)
                continue
            if not self._unpublished_said and self.version == 0 and self.server is None:
                self._unpublished_said = True
                log.warning(
                    "batches handed out before any publish: the collectors act with the weights their policy "
                    "factory made, not the learner's; publish the learner's policy first",
                    version=batch.version,
                    collector=batch.collector,
                )
            self._counts["batches"] += 1
            self._counts["frames"] += batch.frames
            source.taken += 1
            self._last = source
            return batch

    async def publish(self, weights: Mapping[str, torch.Tensor] | nn.Module, version: int | None = None) -> int:
        """Send the collectors the learner's weights as ``version`` (None: the next one) and make it the learner's.

        One group call (a broadcast): the weights cross to each node once. Returns when
        every collector has them (they act with them from their next batch).

        Raises:
            GroupError: Collectors refused the weights or could not be reached
                (it names them; they stay in the collection, and their batches
                say which version they hold).
        """
        if isinstance(weights, nn.Module):
            weights = weights.state_dict()
        self.version = self.version + 1 if version is None else version
        self._counts["published"] += 1
        await ActorGroup([source.ref for source in self._sources]).call(Collector.set_weights, weights, self.version)
        return self.version

    def statistics(self) -> dict[str, Any]:
        """Batches and frames taken, batches dropped or asked again, collectors that failed, publishes, and more."""
        return {
            **self._counts,
            "version": self.version,
            "collectors": len(self._sources),
            "taken": {source.ref.name or repr(source.ref): source.taken for source in self._sources},
        }

    async def aclose(self) -> None:
        """Stop reading: close the collectors' streams and cancel what is asked of them; stop them if told to.

        Collectors already stopped, or lost with their node, are passed over.
        """
        if self._closed:
            return
        self._closed = True
        for source in self._sources:
            if source.pending is not None:
                source.pending.cancel()
        for source in self._sources:
            if source.pending is not None:
                await asyncio.gather(source.pending, return_exceptions=True)
            if source.stream is not None:
                await source.stream.aclose()
        if self.stop_collectors:
            outcomes = await asyncio.gather(*(ref.stop() for ref in self._refs), return_exceptions=True)
            for ref, outcome in zip(self._refs, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    log.debug("collector not stopped", collector=ref.name or repr(ref), error=repr(outcome))

    # ------------------------------------------------------------------ internals

    def _stale(self, batch: Batch) -> bool:
        return self.max_lag is not None and self.version - batch.version > self.max_lag

    def _arm(self, source: _Source) -> None:
        """Ask ``source`` for its next batch: the next item of its stream, or a call (``"wait"``)."""
        if self.max_lag is not None and self.on_lag == "wait":
            floor = max(self.version - self.max_lag, 0)
            asked = self._handover(2)  # one batch at a time: the one taken, the one made
            next_batch: Awaitable[Batch] = source.ref.call(Collector.collect, floor, server=self.server, handover=asked)
        else:
            if source.stream is None:
                # The collector keeps a lease more than the batches the stream may hold unread.
                asked = self._handover(self.window + 1)
                stream = source.ref.stream(Collector.batches, server=self.server, handover=asked)
                source.stream = stream.with_window(self.window)
            next_batch = anext(source.stream)
        source.pending = asyncio.ensure_future(_outcome(next_batch))
        source.pending.add_done_callback(lambda _: setattr(source, "ready_at", next(self._arrivals)))

    def _handover(self, slots: int) -> Handover | None:
        """What to ask of a collector so that its batches come by reference, if they may."""
        return Handover(os.getpid(), slots) if self.shared_memory else None

    def _take(self, source: _Source) -> Batch | None:
        """The batch ``source`` finished (None: its stream ended); a failure leaves it out and is raised."""
        task = source.pending
        assert task is not None
        source.pending = None
        try:
            return task.result()
        except StopAsyncIteration:
            self._sources.remove(source)
            return None
        except Exception as error:
            self._sources.remove(source)
            self._counts["failed"] += 1
            error.add_note(f"from collector {source.ref.name or source.ref}, now left out of the collection")
            raise


async def _outcome(batch: Awaitable[Batch]) -> Batch:
    """Await ``batch`` in a task of its own (a remote call is a future and a coroutine, which ``wait`` refuses)."""
    return await batch


def _age(source: _Source) -> tuple[int, int]:
    """Sort key among ready sources: the oldest version first (a failure before any), then the first ready."""
    task = source.pending
    assert task is not None
    batch = None if task.cancelled() or task.exception() is not None else task.result()
    return (-1 if batch is None else batch.version, source.ready_at)
