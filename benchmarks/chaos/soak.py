"""``main``'s side of the soak: the load it drives, the faults it makes, the checks it runs as it goes.

Rank 0 is never faulted: it runs ``main``, and so this, whose books must
outlive every fault. Each loop of the load runs until the run's end; an error
of the soak's own counts against *typed* and the loop goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import actorch
from actorch.rl import Batch, Collection, Collector
from chaos.books import FLAT_MIB, NAME_GRACE, Book, Fault, Roster, memory_verdict
from chaos.plan import Event, Plan
from chaos.records import Entry, Loss
from chaos.roles import (
    ENVS,
    FRAMES,
    ROLES,
    Caller,
    Echo,
    Ledger,
    Sentinel,
    Teller,
    Walk,
    Witness,
    echo_call,
    intact,
    resident_bytes,
    walk_policy,
)

SCRIPT = Path(__file__).resolve().parent.parent / "soak_chaos.py"
"""The script a joining process runs (``--serve``): the same one, so it finds the same classes."""
SAMPLE_EVERY = 1.0
"""Seconds between memory samples."""
RELOCATION_SLACK = 10.0
"""Seconds past ``liveness_timeout`` a ledger may answer no addition (its node's loss noticed, then the move)."""
JOIN_TIMEOUT = 90.0
"""Seconds a join may take on a loaded machine before it counts as failed."""
RELOCATE = actorch.Restart(relocate=True, max_restarts=1000, within=None, factor=1.0)
"""The ledgers' policy: moved whenever their node is lost, as often as it takes."""
LEDGER_SIZE = 4096
"""Elements of a ledger's tensor (int64): its snapshots carry it."""


@dataclass
class Options:
    """What the inner run needs besides the plan: the epoch, the namespaces, the folder for snapshots and logs."""

    epoch: float
    namespaces: tuple[str, str] | None
    folder: str


class Soak:
    """``main``'s side of the run: the load, the faults and the books."""

    def __init__(self, system: actorch.ActorSystem, plan: Plan, options: Options) -> None:
        self.system = system
        self.plan = plan
        self.options = options
        self.book = Book()
        self.roster = Roster(plan.liveness)
        self.rng = random.Random(plan.seed + 1)
        self.witness: actorch.ActorRef[Witness] | None = None
        self.ledgers: list[actorch.ActorRef[Ledger]] = []
        self.memory: dict[int, list[tuple[float, int]]] = collections.defaultdict(list)
        self.faults_done: collections.Counter[str] = collections.Counter()
        self.skipped: collections.Counter[str] = collections.Counter()
        self.stopped: set[int] = set()
        self.servers: list[subprocess.Popen[bytes]] = []
        self.reports: dict[int, Book] = {}
        self.relocations: list[int] = []
        self.downtimes: list[float] = []
        self.down_since: dict[str, float] = {}  # a ledger answering no addition since then (time.monotonic())
        self.ledger_at: dict[str, int] = {}  # the node each ledger last answered from
        self.respawning: dict[str, float] = {}  # a ledger spawned again after a leave: when it was back (inf: not yet)
        self.joins = asyncio.Lock()  # joins one at a time: ranks come in the order planned
        self.arrived = asyncio.Event()  # set when a node joins
        self.background: set[asyncio.Task[Any]] = set()

    def later(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` beside the loops (a join, a stop's end), kept until it ends."""
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def elapsed(self) -> float:
        return time.time() - self.options.epoch

    async def run(self) -> dict[str, Any]:
        self.witness = await self.system.spawn(Witness, name="soak/witness")
        membership = asyncio.ensure_future(self.watch_membership())
        every = self.plan.snapshot_every
        for index in range(max(2, self.plan.nodes - 1)):
            rank = 1 + index % (self.plan.nodes - 1)
            self.ledgers.append(
                await self.system.spawn(
                    Ledger, args=(every, LEDGER_SIZE), name=f"soak/ledger/{index}", on=rank, restart=RELOCATE
                )
            )
        loops = [
            *(self.forever(self.calls) for _ in range(3)),
            self.forever(self.tells),
            self.forever(self.streams),
            self.forever(self.broadcasts),
            self.forever(self.learn),
            *(self.keep_adding(index) for index in range(len(self.ledgers))),
            self.forever(self.check_names),
            self.forever(self.sample_memory),
            self.forever(self.sample_own_memory),
            self.forever(self.read_losses),
            self.forever(self.read_reports),
            self.forever(self.progress),
        ]
        tasks = [asyncio.ensure_future(loop) for loop in loops]
        try:
            await self.inject()
            await asyncio.sleep(max(0.0, self.options.epoch + self.plan.seconds - time.time()))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in list(self.background):
                task.cancel()
            await asyncio.gather(*self.background, return_exceptions=True)
            for pid in self.stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        await self.final_checks()
        membership.cancel()
        await asyncio.gather(membership, return_exceptions=True)
        return self.summary()

    async def forever(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` again and again; an error of the soak's own is counted and the loop goes on."""
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.book.typed(exc, f"{step.__name__} (the soak's own loop)")
                await asyncio.sleep(0.2)

    # ------------------------------------------------------------------------------------------ membership

    async def watch_membership(self) -> None:
        """Rank 0's own events: nodes join (they get their roles), leave and are lost (rank 0's counts)."""
        async for event in self.system.events("soak/none"):
            if isinstance(event, actorch.NodeJoined) and event.rank != 0:
                self.arrived.set()
                self.roster.pids[event.rank] = event.info.pid
                self.later(self.give_roles(event.rank))
            elif isinstance(event, actorch.NodeLost):
                self.roster.lost_by_0[event.rank] = time.time()
                self.roster.judge_loss(self.book, Loss(0, event.rank, event.reason, time.time()))
            elif isinstance(event, actorch.NodeLeft):
                self.roster.ready.pop(event.rank, None)
                self.roster.collectors.pop(event.rank, None)

    async def give_roles(self, rank: int) -> None:
        """Spawn a new node's roles on it; a node lost meanwhile gets none."""
        refs: dict[str, actorch.ActorRef[Any]] = {}
        try:
            async with asyncio.timeout(60):
                for role, cls in ROLES.items():
                    args = (self.witness,) if cls is Sentinel else ()
                    refs[role] = await self.system.spawn(cls, args=args, name=f"soak/{role}/{rank}", on=rank)
                collector = await self.system.spawn(
                    Collector,
                    args=(Walk, walk_policy),
                    kwargs={"num_envs": ENVS, "frames_per_batch": FRAMES, "seed": rank, "logits": True},
                    name=f"soak/collector/{rank}",
                    on=rank,
                )
        except Exception as exc:
            self.book.typed(exc, f"roles of node {rank}")
            return
        self.roster.ready[rank] = refs
        self.roster.collectors[rank] = collector

    def live(self, role: str) -> list[actorch.ActorRef[Any]]:
        """The refs of ``role`` on the ready nodes rank 0 has not counted lost."""
        lost = self.system.lost_nodes
        return [refs[role] for rank, refs in sorted(self.roster.ready.items()) if rank not in lost]

    # ------------------------------------------------------------------------------------------ load

    async def calls(self) -> None:
        echoes = self.live("echo")
        if echoes:
            await echo_call(self.book, self.rng.choice(echoes), self.rng)
        await asyncio.sleep(0.02)

    async def tells(self) -> None:
        teller = Teller("main", self.book)
        checked = 0.0
        while True:
            sinks = self.live("sink")
            for sink in sinks:
                teller.tell(sink)
            if time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                for sink in sinks:
                    await teller.check(sink, 2.0)
            await asyncio.sleep(0.05)

    async def streams(self) -> None:
        echoes = self.live("echo")
        if not echoes:
            await asyncio.sleep(0.2)
            return
        echo = self.rng.choice(echoes)
        items = self.rng.randrange(5, 40)
        deadline = self.rng.uniform(0.5, 3.0)

        async def read() -> list[int]:
            return [item async for item in echo.stream(Echo.count, items, 0.005)]

        await self.book.call("stream", deadline, read, list(range(items)).__eq__)
        await asyncio.sleep(0.05)

    async def broadcasts(self) -> None:
        echoes = self.live("echo")
        tensor = torch.arange(4096, dtype=torch.float32) * self.rng.random()
        total = float(tensor.sum())
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = 2.0
        try:
            async with asyncio.timeout(deadline):
                outcomes = await asyncio.gather(*actorch.broadcast(echoes, Echo.take, tensor), return_exceptions=True)
        except TimeoutError as exc:
            outcomes = [exc]
        self.book.counts["broadcast"] += 1
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                self.book.typed(outcome, "broadcast")
            else:
                self.book.tallies["typed"].check(outcome == total, f"broadcast: {outcome} for a sum of {total}")
        self.book.ended(started, deadline, "broadcast")
        await asyncio.sleep(0.5)

    async def learn(self) -> None:
        """A round of the learner: a ``Collection`` over the live collectors, a few batches, weights published."""
        lost = self.system.lost_nodes
        collectors = [ref for rank, ref in sorted(self.roster.collectors.items()) if rank not in lost]
        if not collectors:
            await asyncio.sleep(0.5)
            return
        policy = walk_policy()
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.01)
        async with Collection(collectors, on_lag="drop", max_lag=4) as collection:
            published = await self.book.call(
                "publish", 5.0, lambda: collection.publish(policy), lambda version: isinstance(version, int)
            )
            del published
            for _ in range(8):
                batch = await self.book.call("collector batch", 5.0, lambda: next_batch(collection), _is_batch)
                if batch is None or isinstance(batch, TimeoutError):
                    break  # no collector is left in this round, or none answered in time
                if not isinstance(batch, Batch):
                    continue
                self.book.tallies["typed"].check(intact(batch), f"batch of {batch.collector}: not what it played")
                logits = policy(batch.observations.reshape(-1, 2))
                loss = nn.functional.cross_entropy(logits, batch.actions.reshape(-1).long())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                self.book.counts["frames learned"] += batch.frames
                await self.book.call("publish", 5.0, lambda: collection.publish(policy), lambda v: isinstance(v, int))
                await asyncio.sleep(0.1)

    async def keep_adding(self, index: int) -> None:
        """Add to ledger ``index`` one at a time; judge each answer, and each relocation against its snapshot."""
        watch = LedgerWatch(f"soak/ledger/{index}", self.plan.snapshot_every)
        ref = self.ledgers[index]
        while True:
            entry = await self.book.call("ledger add", 2.0, lambda ref=ref: ref.call(Ledger.add), _is_entry)
            if isinstance(entry, Entry):
                self.ledger_at[watch.name] = entry.rank
                if watch.name in self.down_since:
                    down = time.monotonic() - self.down_since.pop(watch.name)
                    self.downtimes.append(down)
                    self.book.tallies["relocation"].check(
                        down <= self.plan.liveness + RELOCATION_SLACK,
                        f"{watch.name} answered no addition for {down:.1f} s, back on node {entry.rank}",
                    )
                watch.observe(entry, self.book, self.relocations)
                await asyncio.sleep(0.05)
                continue
            watch.unknown += 1
            self.down_since.setdefault(watch.name, time.monotonic())
            if isinstance(entry, actorch.ActorStoppedError):  # its node left: spawn it again under its name
                self.respawning[watch.name] = float("inf")
                ref = await self.respawn(watch.name)
                self.respawning[watch.name] = time.time()
            else:
                await asyncio.sleep(0.05)

    async def respawn(self, name: str) -> actorch.ActorRef[Ledger]:
        """Spawn a ledger again under ``name`` on a live worker (it restores from the snapshot directory)."""
        while True:
            ranks = [rank for rank in self.roster.ready if rank not in self.system.lost_nodes]
            if ranks:
                try:
                    async with asyncio.timeout(10):
                        return await self.system.spawn(
                            Ledger,
                            args=(self.plan.snapshot_every, LEDGER_SIZE),
                            name=name,
                            on=self.rng.choice(ranks),
                            restart=RELOCATE,
                        )
                except Exception as exc:
                    self.book.typed(exc, f"spawn {name} again")
            await asyncio.sleep(0.2)

    # ------------------------------------------------------------------------------------------ checks

    async def check_names(self) -> None:
        """*names*: every role of every ready node and every ledger is found by name, and answers there."""
        expected = [(f"soak/{role}/{rank}", rank) for rank, refs in sorted(self.roster.ready.items()) for role in refs]
        expected += sorted(self.ledger_at.items())
        for name, rank in expected:
            await self.check_name(name, rank)
        listed = await self.book.call("lookup_all", 3.0, lambda: self.system.lookup_all("soak/**"), _is_list)
        if isinstance(listed, list):
            now = time.time()
            for ref in listed:
                lost_at = self.roster.lost_by_0.get(ref.rank, now)
                self.book.tallies["names"].check(
                    now - lost_at <= NAME_GRACE,
                    f"lookup_all listed {ref.name} on node {ref.rank}, lost {now - lost_at:.1f} s before",
                )
        await asyncio.sleep(2.0)

    async def check_name(self, name: str, rank: int) -> None:
        """Look ``name`` up (its actor on node ``rank``, as far as ``main`` knows) and call it there.

        Excused: a node faulted, lost or leaving at the start or the end of the
        check, and a ledger being spawned again. A lookup that fails, or finds
        a node rank 0 lost before, breaks *names*; so does an actor that is
        gone when called though its node is not.
        """
        started = time.time()
        if self.roster.gone(rank, started) or self.respawning.get(name, 0.0) >= started:
            return
        found = await self.book.call("lookup", 3.0, lambda: self.system.lookup(name), _is_ref)
        names = self.book.tallies["names"]
        if not isinstance(found, actorch.ActorRef):
            excused = self.roster.gone(rank, time.time()) or self.respawning.get(name, 0.0) >= started
            names.check(excused, f"{name} did not resolve: {type(found).__name__}: {str(found)[:160]}")
            return
        lost_at = self.roster.lost_by_0.get(found.rank, float("inf"))
        if not names.check(lost_at >= started - NAME_GRACE, f"{name} resolved to node {found.rank}, lost before"):
            return
        answer = await self.book.call("ping", 3.0, lambda: found.call("ping"), _is_int)
        if isinstance(answer, (actorch.NodeLostError, actorch.ActorStoppedError)):
            excused = self.roster.gone(found.rank, started) or self.roster.gone(found.rank, time.time())
            names.check(excused, f"{name} resolved to a dead actor on node {found.rank}: {str(answer)[:160]}")

    async def sample_own_memory(self) -> None:
        self.memory[0].append((time.time(), resident_bytes()))
        await asyncio.sleep(SAMPLE_EVERY)

    async def sample_memory(self) -> None:
        for rank, rss in (await self.ask_each("sentinel", "memory sample", Sentinel.rss, _is_int)).items():
            self.memory[rank].append((time.time(), rss))
        await asyncio.sleep(SAMPLE_EVERY)

    async def read_losses(self) -> None:
        await self.read_losses_once()
        await asyncio.sleep(0.5)

    async def read_losses_once(self) -> None:
        """Judge the losses the other nodes counted, told to the witness since the last look."""
        witness = self.witness
        assert witness is not None
        losses = await self.book.call("witness", 5.0, lambda: witness.call(Witness.drain), _is_list)
        for loss in losses if isinstance(losses, list) else ():
            self.roster.judge_loss(self.book, loss)

    async def read_reports(self) -> None:
        await self.read_reports_once()
        await asyncio.sleep(5.0)

    async def read_reports_once(self) -> None:
        """Take every live caller's book as it stands."""
        for rank, report in (await self.ask_each("caller", "report", Caller.report, _is_dict)).items():
            self.reports[rank] = Book.from_json(report)

    async def ask_each(
        self, role: str, what: str, endpoint: Callable[..., Awaitable[Any]], right: Callable[[Any], bool]
    ) -> dict[int, Any]:
        """Call ``endpoint`` of ``role`` on every ready node rank 0 has not lost, one after the other; the answers."""
        answers = {}
        for rank, refs in sorted(self.roster.ready.items()):
            if rank not in self.system.lost_nodes:
                answer = await self.book.call(what, 3.0, lambda ref=refs[role]: ref.call(endpoint), right)
                if right(answer):
                    answers[rank] = answer
        return answers

    async def progress(self) -> None:
        await asyncio.sleep(30.0)
        broken = {name: tally.broken for name, tally in self.book.tallies.items() if tally.broken}
        print(
            f"  {self.elapsed():5.0f} s: nodes {sorted(node.rank for node in self.system.nodes)}, "
            f"faults {sum(self.faults_done.values())}, "
            f"calls {self.book.counts['call']}, load {os.getloadavg()[0]:.1f}, broken {broken or 'none'}",
            flush=True,
        )

    async def final_checks(self) -> None:
        """A last look once the faults are over: every loss told read, every caller's book."""
        await asyncio.sleep(1.0)
        await self.read_losses_once()
        await self.read_reports_once()

    # ------------------------------------------------------------------------------------------ faults

    async def inject(self) -> None:
        """Carry out the plan's events at their times."""
        for event in self.plan.events:
            await asyncio.sleep(max(0.0, self.options.epoch + event.at - time.time()))
            label = event.label(self.plan.liveness)
            if event.kind == "join":
                self.later(self.join(event))
                continue
            if event.kind == "partition":  # FaultyTransport cuts it on every node at its time
                if self.present(event.rank):
                    self.record(event)
                    self.faults_done[label] += 1
                else:
                    self.skipped[label] += 1
                continue
            pid = self.roster.pids.get(event.rank)
            if not self.present(event.rank) or pid is None:
                self.skipped[label] += 1
                continue
            self.faults_done[label] += 1
            if event.kind == "kill":
                self.record(event)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            elif event.kind == "stop":
                self.record(event)
                self.stopped.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                self.later(self.resume(pid, event.seconds))
            elif event.kind == "cut":
                self.record(event)
                self.later(self.cut(event.seconds))
            elif event.kind == "leave":
                self.roster.left[event.rank] = time.time()
                self.later(self.leave(event.rank))

    def present(self, rank: int) -> bool:
        """Whether ``rank`` is a live member now, as rank 0 sees it."""
        return rank in {node.rank for node in self.system.nodes} and rank not in self.roster.left

    def record(self, event: Event) -> None:
        now = time.time()
        end = None if event.long(self.plan.liveness) or event.kind == "kill" else now + event.seconds
        self.roster.faults.append(Fault(event.rank, event.kind, now, end, event.label(self.plan.liveness)))

    async def resume(self, pid: int, seconds: float) -> None:
        try:
            await asyncio.sleep(seconds)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)

    async def cut(self, seconds: float) -> None:
        pair = host_pair(self.options.namespaces)
        pair.partition()
        try:
            await asyncio.sleep(seconds)
        finally:
            pair.heal()

    async def leave(self, rank: int) -> None:
        try:
            async with asyncio.timeout(60):
                await self.system.leave(rank)
        except Exception as exc:
            self.book.typed(exc, f"leave of node {rank}")

    async def join(self, event: Event) -> None:
        """A planned join: one at a time, so that ranks come in the order planned."""
        label = event.label(self.plan.liveness)
        async with self.joins:
            before = {node.rank for node in self.system.nodes}
            try:
                async with asyncio.timeout(JOIN_TIMEOUT):
                    if event.way == "add_nodes":
                        await self.system.add_nodes(1)
                    else:
                        self.servers.append(self.serve(event.way == "serve-netns"))
                        while not {node.rank for node in self.system.nodes} - before:
                            self.arrived.clear()
                            await self.arrived.wait()
            except Exception as exc:
                self.book.typed(exc, f"join ({event.way})")
                self.skipped[label] += 1
                return
            self.faults_done[label] += 1

    def serve(self, netns: bool) -> subprocess.Popen[bytes]:
        """A process that joins with ``actorch.serve`` (in the other namespace with ``netns``)."""
        argv = [sys.executable, str(SCRIPT), "--serve"]
        env = dict(os.environ, **self.system.join_env())
        if netns:
            pair = host_pair(self.options.namespaces)
            argv = pair.b.exec_argv(argv, self.system.join_env())
        return subprocess.Popen(argv, env=env)  # its logs go where rank 0's go

    # ------------------------------------------------------------------------------------------ the verdict

    def summary(self) -> dict[str, Any]:
        """Every figure of the run, as plain data: the tables are printed from it."""
        book = Book()
        book.add(self.book, 0, self.roster)
        for rank, report in sorted(self.reports.items()):
            book.add(report, rank, self.roster)
        flat = memory_verdict(self.memory, {node.rank for node in self.system.nodes}, self.plan.seconds)
        for rank, growth in flat["growth"].items():
            book.tallies["memory"].check(
                growth <= FLAT_MIB, f"node {rank} grew {growth:.1f} MiB after its warm-up (bound {FLAT_MIB:g})"
            )
        for name, since in self.down_since.items():
            down = time.monotonic() - since
            book.tallies["relocation"].check(
                down <= self.plan.liveness + RELOCATION_SLACK, f"{name} answered no addition in its last {down:.1f} s"
            )
        for server in self.servers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(0.1)
        return {
            "book": book.to_json(),
            "faults": dict(self.faults_done),
            "lost_to": dict(collections.Counter(f.label for f in self.roster.faults if self.roster.lost_to(f))),
            "skipped": dict(self.skipped),
            "memory": flat,
            "relocations": self.relocations,
            "downtimes": self.downtimes,
            "nodes_at_end": sorted(node.rank for node in self.system.nodes),
        }


async def next_batch(collection: Collection) -> Batch | None:
    """The collection's next batch; None once no collector is left in it."""
    try:
        return await anext(collection)
    except StopAsyncIteration:
        return None


def _is_batch(value: object) -> bool:
    return value is None or isinstance(value, Batch)


@dataclass
class LedgerWatch:
    """What ``main`` knows of one ledger: which instance answers, the count it answered, additions of unknown outcome.

    An addition whose call timed out or failed with its node may or may not
    have been made; the next answer settles it.
    """

    name: str
    every: int
    incarnation: str | None = None
    acked: int = 0
    unknown: int = 0

    def observe(self, entry: Entry, book: Book, moves: list[int]) -> None:
        """Judge an answer: the next count of the same instance, or a new instance restored from the last save.

        A new instance (the ledger moved, or was spawned again) must have been
        restored from the last multiple of ``every`` the old one reached, that
        is from ``every * (acked // every)`` up to ``acked + unknown``, with its
        tensor intact; what it lost (``acked`` minus that) goes to ``moves``.
        """
        if self.incarnation is not None and entry.incarnation != self.incarnation:
            restored = entry.restored_from or 0
            low, high = self.every * (self.acked // self.every), self.acked + self.unknown
            moves.append(max(0, self.acked - restored))  # an addition of unknown outcome may have been saved
            ok = restored % self.every == 0 and low <= restored <= high and entry.intact
            book.tallies["relocation"].check(
                ok,
                f"{self.name}: restored from {entry.restored_from} (tensor intact: {entry.intact}) on node "
                f"{entry.rank}, after {self.acked} answered and {self.unknown} unknown; its last save was in "
                f"{low}..{high}",
            )
        elif self.incarnation is not None:
            ok = self.acked < entry.value <= self.acked + 1 + self.unknown
            book.tallies["typed"].check(
                ok, f"{self.name}: counted {entry.value} after {self.acked} answered and {self.unknown} unknown"
            )
        self.incarnation, self.acked, self.unknown = entry.incarnation, entry.value, 0


def _is_entry(value: object) -> bool:
    return isinstance(value, Entry)


def _is_ref(value: object) -> bool:
    return isinstance(value, actorch.ActorRef)


def _is_int(value: object) -> bool:
    return isinstance(value, int)


def _is_list(value: object) -> bool:
    return isinstance(value, list)


def _is_dict(value: object) -> bool:
    return isinstance(value, dict)


def host_pair(namespaces: tuple[str, str] | None) -> Any:
    """The two network namespaces the harness made, as ``netns.HostPair``."""
    import netns  # noqa: PLC0415 - only where namespaces are made

    assert namespaces is not None
    a, b = namespaces
    return netns.HostPair(
        netns.Host(a, netns.INTERFACE_A, netns.ADDRESS_A), netns.Host(b, netns.INTERFACE_B, netns.ADDRESS_B)
    )
