"""Test actors shared by the in-process tests and the multi-process scripts, and the scripts' helpers.

Every process imports this module as ``actors``. The scripts in this folder run
as ``python tests/mp_scripts/<script>.py``, so this folder is first on
``sys.path`` in rank 0 and in the workers it spawns (and in every rank that
torchrun starts); ``tests/conftest.py`` puts it on the test process's path.
Actor classes travel by ``module:Qualname``, so one module under one name means
every node resolves ``actors:Counter`` to this very class.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import torch

import actorch
from actorch._base.deadline import current_deadline

MARK = "RESULT "


def emit(check: str, **values: Any) -> None:
    """Print one machine-readable result line for the test to parse."""
    print(MARK + json.dumps({"check": check, **values}, default=repr, ensure_ascii=True), flush=True)


def describe(exc: BaseException) -> dict[str, Any]:
    """A JSON-friendly description of an exception (its class tree and text)."""
    return {
        "type": type(exc).__name__,
        "mro": [cls.__name__ for cls in type(exc).__mro__],
        "message": str(exc),
    }


async def attempt(awaitable: Awaitable[Any]) -> dict[str, Any]:
    """Await and describe the outcome: ``{"value": ...}`` or ``{"error": {...}}``, with the time taken."""
    started = time.monotonic()
    try:
        value = await awaitable
    except Exception as exc:
        return {"error": describe(exc), "seconds": time.monotonic() - started}
    return {"value": value, "seconds": time.monotonic() - started}


async def run_checks(
    system: actorch.ActorSystem, checks: list[tuple[str, Any]], *, seconds: float = 30.0
) -> dict[str, Any]:
    """Run each ``check(system)`` under a deadline and emit what it returned, or how it failed."""
    for name, check in checks:
        started = time.monotonic()
        try:
            async with asyncio.timeout(seconds):
                values = await check(system)
        except BaseException as exc:
            emit(name, failed=describe(exc), traceback=traceback.format_exc(), seconds=time.monotonic() - started)
            if not isinstance(exc, Exception):
                raise
        else:
            emit(name, **{"seconds": time.monotonic() - started, **values})  # a check may time itself
    return {"main": "returned", "checks": len(checks)}


def attempt_now(fn: Callable[[], Any]) -> dict[str, Any]:
    """Call ``fn`` and describe the outcome like :func:`attempt`."""
    try:
        return {"value": fn()}
    except Exception as exc:
        return {"error": describe(exc)}


def is_dead(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


async def wait_lost(system: actorch.ActorSystem, rank: int) -> float:
    """Seconds until this node counts node ``rank`` lost."""
    started = time.monotonic()
    if rank not in system.lost_nodes:
        async for event in system.events():
            if isinstance(event, actorch.NodeLost) and event.rank == rank:
                break
    return time.monotonic() - started


def write_file(path: str, text: str) -> None:
    Path(path).write_text(text)


class CustomError(Exception):
    """A user exception class that the caller can import too."""


class Counter(actorch.Actor):
    """The counter of DESIGN.md, with endpoints to locate it, to fail in chosen ways and to echo values."""

    def __init__(self, start: int = 0) -> None:
        self.value = start

    async def add(self, k: int = 1) -> int:
        self.value += k
        return self.value

    async def get(self) -> int:
        return self.value

    async def where(self) -> list[int]:
        return [self.system.rank, os.getpid()]

    async def _private(self) -> int:
        return -1

    async def explode(self, message: str) -> None:
        raise ValueError(message)

    async def explode_custom(self, message: str) -> None:
        raise CustomError(message)

    async def explode_local(self) -> None:
        class LocalOnlyError(Exception):
            pass

        raise LocalOnlyError("defined inside a function")

    async def give_set(self) -> Any:
        return {1, 2, 3}

    async def echo(self, value: Any) -> Any:
        return value


class Recorder(actorch.Actor):
    """Appends what it is sent, with who sent it, to check ordering."""

    def __init__(self) -> None:
        self.log: list[Any] = []

    async def append(self, caller: str, index: int) -> int:
        self.log.append([caller, index])
        return index

    async def append_with(self, caller: str, index: int, payload: Any) -> int:
        """Append, with a payload (a tensor large enough to travel by torch RPC rather than the fast lane)."""
        self.log.append([caller, index])
        return index

    async def entries(self) -> list[Any]:
        return self.log

    async def node_statistics(self) -> dict[str, Any]:
        return self.system.statistics()


class Sender(actorch.Actor):
    """Sends interleaved tells and calls to another actor from its own node."""

    async def blast(self, target: actorch.ActorRef[Recorder], caller: str, count: int) -> int:
        return await send_interleaved(target, caller, count)


async def send_interleaved(target: actorch.ActorRef[Recorder], caller: str, count: int) -> int:
    """Send ``count`` messages (every third a call, the rest tells) in index order."""
    calls = []
    for index in range(count):
        if index % 3 == 0:
            calls.append(asyncio.ensure_future(target.call(Recorder.append, caller, index)))
            await asyncio.sleep(0)  # let the call task send before the next message
        else:
            target.tell(Recorder.append, caller, index)
    results = await asyncio.gather(*calls)
    return len(results)


class Finder(actorch.Actor):
    """Looks names up from its own node."""

    async def find(self, name: str) -> list[Any]:
        ref = await self.system.lookup(name)
        return [ref.name, ref.rank, await ref.call("get")]

    async def find_within(self, name: str, seconds: float) -> dict[str, Any]:
        started = time.monotonic()
        try:
            async with asyncio.timeout(seconds):
                ref = await self.system.lookup(name)
        except Exception as exc:
            return {"error": describe(exc), "seconds": time.monotonic() - started}
        return {"found": [ref.name, ref.rank], "seconds": time.monotonic() - started}

    async def list_names(self, pattern: str) -> list[str | None]:
        return [ref.name for ref in await self.system.lookup_all(pattern)]

    async def stop_named(self, name: str) -> None:
        await (await self.system.lookup(name)).stop()

    async def block(self, seconds: float) -> None:
        """Keep this node's event loop busy, as CPU-bound code in a handler does."""
        time.sleep(seconds)  # noqa: ASYNC251 - blocking the loop is the point


class Gauge(actorch.Actor):
    """Measures how many ``work`` handlers overlap."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0

    async def work(self, seconds: float) -> int:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.running -= 1
        return self.peak

    async def peak_seen(self) -> int:
        return self.peak


class WideGauge(Gauge):
    max_concurrency = 3


class Ping(actorch.Actor):
    """One side of a re-entrant chain A -> B -> A."""

    def __init__(self) -> None:
        self.busy = False
        self.echoes = 0

    async def ping_via(self, other: actorch.ActorRef[Any], value: int) -> int:
        return await other.call("bounce", self.ref, value)

    async def bounce(self, back: actorch.ActorRef[Any], value: int) -> int:
        return await back.call("echo", value) + 1

    async def echo(self, value: int) -> int:
        self.echoes += 1
        return value * 10


class Slow(actorch.Actor):
    """Records when its slow handler starts, finishes or is cancelled."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def slow(self, tag: str, seconds: float) -> str:
        self.events.append(f"started {tag}")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.events.append(f"cancelled {tag}")
            raise
        self.events.append(f"finished {tag}")
        return tag

    async def history(self) -> list[str]:
        return self.events


class Store(actorch.Actor):
    """Keeps tensors it is sent, and sends tensors back."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []

    async def keep(self, tensor: torch.Tensor) -> None:
        self.kept.append(tensor)

    async def first_kept(self) -> torch.Tensor:
        return self.kept[0]

    async def kept_sums(self) -> list[float]:
        return [float(t.sum()) for t in self.kept]

    async def echo(self, value: Any) -> Any:
        return value

    async def double(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {key: value * 2 for key, value in batch.items()}


class Stopper(actorch.Actor):
    """Writes a file in ``on_stop`` (the test checks it exists)."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def on_stop(self) -> None:
        write_file(self.path, f"stopped on node {self.system.rank} pid {os.getpid()}\n")

    async def where(self) -> list[int]:
        return [self.system.rank, os.getpid()]


class BadStart(actorch.Actor):
    async def on_start(self) -> None:
        raise ValueError("on_start refused")

    async def get(self) -> int:
        return 0


class Victim(actorch.Actor):
    """Kills its own process on request."""

    max_concurrency = 4

    async def hang(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "survived"

    async def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    async def get(self) -> int:
        return os.getpid()


class Producer(actorch.Actor):
    """Streams numbers, records how far it got and whether its generator was closed."""

    max_concurrency = 4  # so status calls run beside a stream

    def __init__(self) -> None:
        self.made = 0
        self.closed = 0
        self.deadlines: list[float | None] = []

    async def count(self, n: int | None = None, delay: float = 0.0, fail_at: int | None = None) -> AsyncIterator[int]:
        """Yield 0, 1, ... (forever without ``n``), ``delay`` s apart; raise ``ValueError`` at ``fail_at``."""
        self.deadlines.append(current_deadline())
        try:
            index = 0
            while n is None or index < n:
                if index == fail_at:
                    raise ValueError(f"failed at {index}")
                if delay:
                    await asyncio.sleep(delay)
                self.made += 1
                yield index
                index += 1
        finally:
            self.closed += 1

    async def tensors(self, n: int, size: int = 4) -> AsyncIterator[torch.Tensor]:
        """Yield one buffer ``n`` times, overwritten with the item's index each time (a tear would show)."""
        buffer = torch.zeros(size)
        for index in range(n):
            buffer.fill_(index)
            yield buffer

    async def status(self) -> dict[str, Any]:
        return {"made": self.made, "closed": self.closed, "deadlines": self.deadlines}

    async def plain(self) -> int:
        return 1


class Holder(actorch.Actor):
    """Keeps a ref it is given and calls through it later: a ref held away from the caller that made it."""

    def __init__(self) -> None:
        self.held: actorch.ActorRef[Any] | None = None

    async def hold(self, ref: actorch.ActorRef[Any]) -> None:
        self.held = ref

    async def call_held(self, endpoint: str, *args: Any) -> Any:
        assert self.held is not None
        return await self.held.call(endpoint, *args)


class Tally(actorch.Actor):
    """A relocatable count that saves a snapshot every ``every`` additions; it can hang and say where it runs."""

    max_concurrency = 4  # a hanging call leaves room for others

    def __init__(self, every: int = 5) -> None:
        self.every = every
        self.count = 0
        self.told: list[int] = []

    def restore(self, state: int) -> None:
        self.count = state

    async def add(self, k: int = 1) -> int:
        self.count += k
        if self.count % self.every == 0:
            await self.save_snapshot(self.count)
        return self.count

    async def get(self) -> int:
        return self.count

    async def tell_me(self, value: int) -> None:
        self.told.append(value)

    async def heard(self) -> list[int]:
        return self.told

    async def where(self) -> list[int]:
        return [self.system.rank, os.getpid()]

    async def hang(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "survived"

    async def upto(self, n: int) -> AsyncIterator[int]:
        for index in range(n):
            yield index


class Simulator(actorch.Actor):
    """Stands for an environment simulator: says where it runs (pid, network namespace), burns CPU on request."""

    async def where(self) -> dict[str, Any]:
        return {
            "rank": self.system.rank,
            "pid": os.getpid(),
            "env": os.environ.get("POOL_TEST_ENV"),
            "netns": os.readlink("/proc/self/ns/net"),
        }

    async def work(self, seconds: float) -> float:
        """Compute for ``seconds`` of this process's CPU time; the wall time it took."""
        started, spent = time.monotonic(), time.process_time()
        while time.process_time() - spent < seconds:
            sum(range(10_000))
        return time.monotonic() - started

    async def start_a_process(self) -> int | None:
        """Start a child process, as a DataLoader's workers do, and wait for it; its exit code."""
        child = multiprocessing.get_context("fork").Process(target=os._exit, args=(7,))
        child.start()
        await asyncio.to_thread(child.join, 30)
        return child.exitcode


class Rendezvous(actorch.Actor):
    """Lets callers through only once ``parties`` of them are waiting at once."""

    max_concurrency = 100

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.everyone = asyncio.Event()

    async def arrive(self) -> int:
        self.arrived += 1
        if self.arrived == self.parties:
            self.everyone.set()
        await self.everyone.wait()
        return self.arrived


class Worker(actorch.Actor):
    """A group member known by its tag: answers, fails, sleeps (counting starts and cancellations) and records."""

    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.received: list[Any] = []
        self.started = 0
        self.cancelled = 0

    async def ident(self) -> int:
        return self.tag

    async def add(self, x: int, *, y: int = 0) -> int:
        return self.tag + x + y

    async def keywords(self, /, **kwargs: Any) -> dict[str, Any]:  # self positional-only: mypy's Concatenate wants it
        return kwargs

    async def echo(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [list(args), kwargs]

    async def fail_if(self, tag: int) -> int:
        if tag == self.tag:
            raise ValueError(f"worker {self.tag} refuses")
        return self.tag

    async def give_up(self) -> None:
        raise asyncio.CancelledError

    async def meet(self, rendezvous: actorch.ActorRef[Rendezvous]) -> int:
        await rendezvous.call(Rendezvous.arrive)
        return self.tag

    async def sleep(self, seconds: float) -> int:
        self.started += 1
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return self.tag

    async def counts(self) -> dict[str, int]:
        return {"started": self.started, "cancelled": self.cancelled}

    async def record(self, value: Any) -> None:
        self.received.append(value)

    async def recorded(self) -> list[Any]:
        return self.received

    async def loss(self, batch: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        loss: torch.Tensor = model(batch).square().mean()
        return loss

    async def stats(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        return {"sum": batch["x"].sum(), "rows": batch["x"].shape[0], "pair": (batch["y"].sum(), 1.0)}


class Sleeper(Worker):
    """A :class:`Worker` that answers ``counts`` while it sleeps."""

    max_concurrency = 4  # so status calls run beside a sleeping handler


class Stranger(actorch.Actor):
    """An actor of another class, with none of a group's endpoints."""

    async def other(self) -> str:
        return "other"


class Drainer(actorch.Actor):
    """Consumes a stream in a handler, on another node than the caller's."""

    async def drain(self, producer: actorch.ActorRef[Producer]) -> None:
        async for _ in producer.stream(Producer.count, delay=0.01):
            pass


async def wait_until_counts(ref: actorch.ActorRef[Any], **expected: int) -> None:
    """Wait (2 s at most) until the actor's ``counts`` endpoint reports the ``expected`` started and cancelled."""
    async with asyncio.timeout(2):
        while True:
            counts = await ref.call("counts")
            if all(counts[key] == value for key, value in expected.items()):
                return
            await asyncio.sleep(0.005)
