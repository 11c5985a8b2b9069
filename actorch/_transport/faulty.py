"""The faulty kind of transport: any other kind, with bundles dropped, delayed or cut off on a schedule or at random.

``FaultyTransport(inner, *faults, seed=, epoch=)`` is its options record, and
like every kind's it is what a user passes (``run(transport=...)``,
``local_world(transport=...)``): frozen data that pickles and turns into json,
so that it travels to the processes a launch spawns and to those that join,
and each node rebuilds the same schedule. ``inner`` is the options record of
the kind it wraps; each node's ``FaultInjection`` wraps that kind's transport.

The faults apply where a bundle leaves, to the links they name (``src`` the
sending rank, ``dst`` the receiving one; None: any), while the schedule's
clock is in ``[start, stop)``. The clock counts seconds from ``epoch`` (a
``time.time()`` value, the same on every node), or from each node's start.

- ``Drop(probability)``: a bundle is lost with that probability, drawn from
  the node's own generator (seeded by ``seed`` and its rank, so a run repeats).
- ``Delay(seconds, jitter)``: a bundle waits ``seconds`` plus up to
  ``jitter`` more, drawn at random; a link keeps its order (a bundle never
  overtakes one sent before it on its link), so links reorder against each
  other, never within themselves.
- ``Partition(side)``: every link between ``side`` and the other ranks is
  cut, both ways: bundles wait (and leave in order if it heals in time),
  replies leave as messages of their own rather than on a response, and the
  wrapped transport stops hearing and pinging the other side
  (``capabilities.Severable``), its lane included, so each side counts the
  other lost past the liveness timeout, by its silence, as a real partition
  shows it: the side that counts first cannot tell the other so. A kind
  with no heartbeats (in-process) is told so by this one at the same bound.

A bundle sent inside a distributed autograd context must leave in that
context: it is never delayed (what waits on its link leaves first), and drops
and partitions lose it.

With no faults, a ``FaultyTransport`` behaves exactly as its inner kind, and
passes the same conformance suite.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self

import structlog
import torch

from actorch._base.config import is_number
from actorch._transport.base import Bundle, Port, Transport
from actorch._transport.capabilities import severable_of
from actorch._transport.kind import Dump, Kind, Load
from actorch._transport.world import WorldSpec
from actorch._transport.wrapper import Wrapper

__all__ = ["KIND", "Delay", "Drop", "Fault", "FaultInjection", "FaultyTransport", "Partition"]

log = structlog.get_logger("actorch")


def _check_window(start: float, stop: float | None) -> None:
    if not is_number(start):
        raise ValueError(f"start must be a number of seconds >= 0, not {start!r}")
    if stop is not None and (not is_number(stop) or stop <= start):
        raise ValueError(f"stop must be None or a number of seconds after start ({start!r}), not {stop!r}")


def _check_rank(value: object, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{what} must be a rank (an int >= 0) or None (any), not {value!r}")


@dataclass(frozen=True)
class Drop:
    """Lose bundles on the links from ``src`` to ``dst`` (None: any) with ``probability``, from ``start`` to ``stop``.

    Raises:
        ValueError: A probability outside 0..1, a bad rank or window.
    """

    probability: float = 1.0
    src: int | None = None
    dst: int | None = None
    start: float = 0.0
    stop: float | None = None

    def __post_init__(self) -> None:
        if not is_number(self.probability) or self.probability > 1:
            raise ValueError(f"probability must be a number in 0..1, not {self.probability!r}")
        _check_rank(self.src, "src")
        _check_rank(self.dst, "dst")
        _check_window(self.start, self.stop)


@dataclass(frozen=True)
class Delay:
    """Hold bundles on the links from ``src`` to ``dst`` (None: any) ``seconds`` plus up to ``jitter`` more.

    Raises:
        ValueError: A negative or non-finite delay, a bad rank or window.
    """

    seconds: float
    jitter: float = 0.0
    src: int | None = None
    dst: int | None = None
    start: float = 0.0
    stop: float | None = None

    def __post_init__(self) -> None:
        for name in ("seconds", "jitter"):
            if not is_number(getattr(self, name)):
                raise ValueError(f"{name} must be a number of seconds >= 0, not {getattr(self, name)!r}")
        _check_rank(self.src, "src")
        _check_rank(self.dst, "dst")
        _check_window(self.start, self.stop)


@dataclass(frozen=True)
class Partition:
    """Cut every link between the ranks of ``side`` and the others, both ways, from ``start`` to ``stop``.

    Raises:
        ValueError: ``side`` is empty or holds something other than ranks, or a bad window.
    """

    side: frozenset[int]
    start: float = 0.0
    stop: float | None = None

    def __init__(self, side: Iterable[int], start: float = 0.0, stop: float | None = None) -> None:
        ranks = frozenset(side)
        if not ranks:
            raise ValueError("a partition's side must hold at least one rank")
        for rank in ranks:
            _check_rank(rank, "a partition's side")
        _check_window(start, stop)
        object.__setattr__(self, "side", ranks)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "stop", stop)

    def cuts(self, rank: int, other: int) -> bool:
        """Whether the link between ``rank`` and ``other`` crosses the partition."""
        return (rank in self.side) != (other in self.side)


Fault = Drop | Delay | Partition
"""One rule of a ``FaultyTransport``'s schedule."""

_FAULTS: dict[str, type[Drop] | type[Delay] | type[Partition]] = {
    "drop": Drop,
    "delay": Delay,
    "partition": Partition,
}


def _fault_to_json(fault: Fault) -> dict[str, Any]:
    data = dataclasses.asdict(fault)
    if isinstance(fault, Partition):
        data["side"] = sorted(fault.side)
    name = next(name for name, kind in _FAULTS.items() if isinstance(fault, kind))
    return {"fault": name, **data}


def _fault_from_json(data: Mapping[str, Any]) -> Fault:
    fields = dict(data)
    kind = _FAULTS.get(fields.pop("fault", None))
    if kind is None:
        raise ValueError(f"not a fault: {dict(data)!r} (faults are {', '.join(_FAULTS)})")
    return kind(**fields)


@dataclass(frozen=True, init=False)
class FaultyTransport:
    """Any kind of transport with faults: ``FaultyTransport(TorchRpc(), Partition({2}, start=5.0), seed=7)``.

    See the module ``actorch._transport.faulty`` for what each fault does.

    Attributes:
        inner: The options record of the kind it wraps (``TorchRpc()``, ``InProcess()``).
        faults: The schedule: ``Drop``, ``Delay`` and ``Partition`` rules, in any number.
        seed: Seeds each node's random draws (with its rank), so that a run repeats.
        epoch: The ``time.time()`` the schedule counts from, the same on every
            node; None: each node counts from its own start.

    Raises:
        TypeError: A fault that is not a ``Drop``, ``Delay`` or ``Partition``.
        ValueError: A seed that is not an int, or an epoch that is not a time.
    """

    inner: Any
    faults: tuple[Fault, ...]
    seed: int
    epoch: float | None

    def __init__(self, inner: object, *faults: Fault, seed: int = 0, epoch: float | None = None) -> None:
        for fault in faults:
            if not isinstance(fault, (Drop, Delay, Partition)):
                raise TypeError(f"FaultyTransport takes Drop, Delay and Partition faults, not {fault!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, not {seed!r}")
        if epoch is not None and not is_number(epoch):
            raise ValueError(f"epoch must be None or a time.time() value, not {epoch!r}")
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "faults", tuple(faults))
        object.__setattr__(self, "seed", seed)
        object.__setattr__(self, "epoch", epoch)

    def refuses_elastic(self) -> str | None:
        """As the wrapped kind."""
        refusal: str | None = self.inner.refuses_elastic()
        return refusal

    def fixes_world(self) -> str | None:
        """As the wrapped kind."""
        reason: str | None = self.inner.fixes_world()
        return reason

    def joining(self, timeout: float | None = None) -> Self:
        """The same faults over the wrapped kind's options for a newcomer."""
        return type(self)(self.inner.joining(timeout), *self.faults, seed=self.seed, epoch=self.epoch)

    def to_json(self, dump: Dump) -> dict[str, Any]:
        """The wrapped kind's options (as ``dump`` makes them), the faults, the seed and the epoch."""
        return {
            "inner": dump(self.inner),
            "faults": [_fault_to_json(fault) for fault in self.faults],
            "seed": self.seed,
            "epoch": self.epoch,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], load: Load) -> FaultyTransport:
        """The record ``to_json`` made (``load`` rebuilds the wrapped kind's options).

        Raises:
            ValueError: A fault it does not know, or a value a fault does not take.
        """
        faults = [_fault_from_json(fault) for fault in data.get("faults", ())]
        return cls(load(data["inner"]), *faults, seed=data.get("seed", 0), epoch=data.get("epoch"))


@dataclass(slots=True)
class _Waiting:
    """A bundle waiting on its link: until ``release`` (loop time), or until the link heals (None)."""

    release: float | None
    bundle: Bundle


class FaultInjection(Wrapper):
    """A node's transport of the faulty kind: ``inner`` with ``options``' faults on the links from this node.

    Args:
        inner: The wrapped kind's transport.
        options: The faults, seed and epoch.
        liveness_timeout: Seconds a cut-off peer stays silent before it is lost.
    """

    def __init__(self, inner: Transport, options: FaultyTransport, *, liveness_timeout: float) -> None:
        super().__init__(inner)
        self._faults = options.faults
        self._drops = tuple(fault for fault in options.faults if isinstance(fault, Drop))
        self._delays = tuple(fault for fault in options.faults if isinstance(fault, Delay))
        self._partitions = tuple(fault for fault in options.faults if isinstance(fault, Partition))
        self._epoch = options.epoch
        self._random = random.Random(f"{options.seed}/{inner.rank}")  # noqa: S311 - faults, not secrets
        self._liveness_timeout = liveness_timeout
        self._clock0 = 0.0  # the loop's time at the schedule's second 0
        self._links: dict[int, deque[_Waiting]] = {}  # per destination, bundles waiting, in send order
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._active: list[Partition] = []  # partitions in force now
        self._cut: frozenset[int] = frozenset()  # ranks cut off from this node now
        self._handles: list[asyncio.Handle] = []  # the schedule's timers
        self._lost_peers: set[int] = set()
        self.dropped = 0
        """Bundles lost to ``Drop`` faults and to partitions (those of an autograd context)."""
        self.delayed = 0
        """Bundles held by ``Delay`` faults."""
        self.held = 0
        """Bundles held by partitions."""

    def __repr__(self) -> str:
        faults, cut = len(self._faults), sorted(self._cut)
        return f"<FaultInjection rank={self.rank} faults={faults} cut={cut} over {self.inner!r}>"

    def statistics(self) -> dict[str, Any]:
        """Bundles dropped, delayed and held by partitions so far, those waiting now, and the ranks cut off now."""
        return {
            "dropped": self.dropped,
            "delayed": self.delayed,
            "held": self.held,
            "waiting": sum(map(len, self._links.values())),
            "cut": sorted(self._cut),
        }

    def _now(self) -> float:
        """The schedule's clock: seconds since its epoch (or this node's start)."""
        assert self._loop is not None
        return self._loop.time() - self._clock0

    async def start(self) -> None:
        """Start the schedule's clock, join the world through ``inner``, and arm the partitions."""
        loop = asyncio.get_running_loop()
        self._clock0 = loop.time() if self._epoch is None else loop.time() + self._epoch - time.time()
        await super().start()
        now = self._now()
        for partition in self._partitions:
            if partition.stop is not None and partition.stop <= now:
                continue  # over before this node joined
            if partition.start <= now:
                self._begin(partition)  # in force already: from the first bundle on
            else:
                self._handles.append(loop.call_at(self._clock0 + partition.start, self._begin, partition))
            if partition.stop is not None:
                self._handles.append(loop.call_at(self._clock0 + partition.stop, self._end, partition))

    async def close(self) -> None:
        """Stop the schedule; what waits on the links is dropped (a closing transport may drop pending sends)."""
        self._flush()  # what is queued goes through the faults first, as any send
        for handle in [*self._handles, *self._timers.values()]:
            handle.cancel()
        self._handles.clear()
        self._timers.clear()
        self._links.clear()
        await super().close()

    # ------------------------------------------------------------------ sending

    def _matches(self, fault: Drop | Delay, dest: int, now: float) -> bool:
        return (
            (fault.src is None or fault.src == self.rank)
            and (fault.dst is None or fault.dst == dest)
            and fault.start <= now
            and (fault.stop is None or now < fault.stop)
        )

    def _drawn_drop(self, dest: int, now: float) -> bool:
        """Whether a drop in force on the link to ``dest`` loses the bundle now (a draw per such drop)."""
        return any(self._matches(drop, dest, now) and self._random.random() < drop.probability for drop in self._drops)

    def _send_bundle(self, dest: int, bundle: Bundle, in_context: bool) -> str | None:
        if not self._faults:
            return self.inner.carry(dest, bundle, in_context)
        now = self._now()
        cut = dest in self._cut
        if (cut and in_context) or (not cut and self._drawn_drop(dest, now)):
            self.dropped += 1
            return None
        path = self.inner.path(dest, bool(bundle[1]))
        link = self._links.get(dest)
        if in_context:  # it must leave in this thread's autograd context: what waits on its link leaves first
            if link:
                self._release(dest, everything=True)
            return self.inner.carry(dest, bundle, in_context)
        if cut:
            self.held += 1
            self._wait(dest, _Waiting(None, bundle))
            return path
        seconds = 0.0
        for delay in self._delays:
            if self._matches(delay, dest, now):
                seconds += delay.seconds + (self._random.uniform(0.0, delay.jitter) if delay.jitter else 0.0)
        if not seconds and not link:
            return self.inner.carry(dest, bundle, in_context)
        assert self._loop is not None
        release = self._loop.time() + seconds
        if link and link[-1].release is not None:
            release = max(release, link[-1].release)  # a link keeps its order
        if seconds:
            self.delayed += 1
        self._wait(dest, _Waiting(release, bundle))
        return path

    def _wait(self, dest: int, waiting: _Waiting) -> None:
        link = self._links.setdefault(dest, deque())
        link.append(waiting)
        if len(link) == 1:
            self._arm(dest)

    def _arm(self, dest: int) -> None:
        """Wake for the first bundle waiting on ``dest``'s link, if it waits for a time (not for a heal)."""
        timer = self._timers.pop(dest, None)
        if timer is not None:
            timer.cancel()
        link = self._links.get(dest)
        if link and link[0].release is not None and dest not in self._cut:
            assert self._loop is not None
            self._timers[dest] = self._loop.call_at(link[0].release, self._release, dest)

    def _release(self, dest: int, *, everything: bool = False) -> None:
        """Send what waits on ``dest``'s link and whose time came (``everything``: all of it), in order."""
        self._timers.pop(dest, None)
        link = self._links.get(dest)
        if not link or dest in self._cut:
            return
        assert self._loop is not None
        now = self._loop.time()
        while link and (everything or (link[0].release is not None and link[0].release <= now)):
            self.inner.carry(dest, link.popleft().bundle)
        if link:
            self._arm(dest)
        else:
            del self._links[dest]

    def reply(self, dest: int, port: Port | None, message: bytes, tensors: list[torch.Tensor] | None) -> None:
        """A reply to a node over a faulty link leaves as a message of its own, so that the faults reach it."""
        if port is not None and self._faults and self._touches(dest):
            port.release()
            port = None
        super().reply(dest, port, message, tensors)

    def _touches(self, dest: int) -> bool:
        """Whether any fault applies to the link to ``dest`` now, or bundles wait on it."""
        if dest in self._cut or self._links.get(dest):
            return True
        now = self._now()
        rules: tuple[Drop | Delay, ...] = (*self._drops, *self._delays)
        return any(self._matches(rule, dest, now) for rule in rules)

    def ask_off_loop(self, rank: int, question: str, timeout: float) -> Any:
        """As ``inner`` does, unless ``rank`` is cut off: then nothing answers (``TimeoutError``)."""
        if rank in self._cut:
            raise TimeoutError(f"node {rank} is cut off from this node (a partition)")
        return self.inner.ask_off_loop(rank, question, timeout)

    # ------------------------------------------------------------------ partitions

    def _cut_by(self, partitions: Collection[Partition]) -> frozenset[int]:
        ranks = [info.rank for info in self.inner.peers()]
        return frozenset(
            rank
            for rank in ranks
            if rank != self.rank and rank not in self._lost_peers and any(p.cuts(self.rank, rank) for p in partitions)
        )

    def _begin(self, partition: Partition) -> None:
        """A partition begins: cut this node off from the other side, liveness included."""
        self._active.append(partition)
        newly = self._cut_by(self._active) - self._cut
        self._cut = self._cut | newly
        if not newly:
            return
        log.warning("partition: links cut", node=self.rank, peers=sorted(newly))
        for dest in newly:
            timer = self._timers.pop(dest, None)
            if timer is not None:
                timer.cancel()
        severable = severable_of(self.inner)
        if severable is not None:
            severable.sever(newly)
        else:  # a kind without heartbeats: silence is this node's to judge
            assert self._loop is not None
            self._handles.append(self._loop.call_later(self._liveness_timeout, self._silent, newly))

    def _end(self, partition: Partition) -> None:
        """A partition ends: the links it cut heal (those not cut by another), and what waited on them leaves."""
        if partition in self._active:
            self._active.remove(partition)
        healed = self._cut - self._cut_by(self._active)
        self._cut = self._cut - healed
        if not healed:
            return
        log.warning("partition: links healed", node=self.rank, peers=sorted(healed))
        severable = severable_of(self.inner)
        if severable is not None:
            severable.heal(healed)
        assert self._loop is not None
        now = self._loop.time()
        for dest in healed:
            link = self._links.get(dest)
            if link:
                for waiting in link:
                    if waiting.release is None:
                        waiting.release = now
                self._release(dest)

    def _silent(self, ranks: frozenset[int]) -> None:
        """Ranks cut off for the liveness timeout are lost, where the wrapped kind has no heartbeats to say so."""
        timeout = self._liveness_timeout
        for rank in sorted(ranks & self._cut):
            self._inner_lost(rank, f"not heard from for {timeout:.1f} s (liveness timeout {timeout:g} s; a partition)")

    def _inner_lost(self, rank: int, why: str) -> None:
        """A lost peer's waiting bundles are dropped; its loss is reported."""
        self._lost_peers.add(rank)
        self._links.pop(rank, None)
        timer = self._timers.pop(rank, None)
        if timer is not None:
            timer.cancel()
        self._report_lost(rank, why)


def _open(spec: WorldSpec, options: FaultyTransport, inner: Transport | None) -> Transport:
    """The wrapped kind's transport (opened first, from ``options.inner``), with ``options``' faults."""
    assert inner is not None, "a faulty transport wraps the transport of its inner kind"
    return FaultInjection(inner, options, liveness_timeout=spec.liveness_timeout)


def _wrapped(options: FaultyTransport) -> object:
    return options.inner


KIND: Kind[FaultyTransport] = Kind(
    name="faulty",
    options=FaultyTransport,
    open=_open,
    load=FaultyTransport.from_json,
    wraps=_wrapped,
)
"""Any kind, with faults on its links (``actorch.testing.FaultyTransport``)."""
