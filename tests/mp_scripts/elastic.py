"""Elastic systems over real torch RPC: nodes join from other processes, leave, die and come back.

Usage: ``python elastic.py grow|tokens|churn|agent|shared|remote TMPDIR``.
``shared`` runs ``grow``, ``churn`` and ``agent`` one after the other in one
system of two (each starts from the launch's own two nodes), so that their
tests pay for one start. In ``remote`` mode rank 0 listens on ``ELASTIC_HOST:ELASTIC_PORT`` and waits for a
node labelled ``host-b`` that the test starts on another (namespace) host. Rank 0 starts an
elastic system and launches each joiner as ``python joiner.py LABEL`` with the
system's address and token in its environment, as a user would; a joiner's
output goes to ``TMPDIR/<label>.out``. Every check prints one ``RESULT {json}``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from actors import attempt, emit
from elastic_actors import Caller, Tally, Worker, small_policy

import actorch
from actorch import Agent, Observer

MODE = sys.argv[1]
TMP = Path(sys.argv[2])
HERE = Path(__file__).resolve().parent
JOINERS: dict[str, subprocess.Popen[bytes]] = {}


def start_joiner(
    system: actorch.ActorSystem,
    label: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    asking: Path | None = None,
) -> subprocess.Popen[bytes]:
    """``python joiner.py label`` with what joining takes in its environment (``env`` overrides it)."""
    environ = {**os.environ, **system.join_env(), **(env or {})}
    environ = {key: value for key, value in environ.items() if value != "<unset>"}
    with (TMP / f"{label}.out").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "joiner.py"), label, str(timeout), *([str(asking)] if asking else [])],
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    JOINERS[label] = proc
    return proc


async def joined(system: actorch.ActorSystem, label: str, within: float = 30.0) -> int:
    """The rank of the node labelled ``label``, once it has joined."""
    async with asyncio.timeout(within):
        while True:
            for info in system.nodes:
                if info.label == label and info.rank not in system.lost_nodes:
                    return info.rank
            await asyncio.sleep(0.02)


async def exit_code(label: str, within: float = 20.0) -> int | None:
    proc = JOINERS[label]
    try:
        return await asyncio.to_thread(proc.wait, within)
    except subprocess.TimeoutExpired:
        return None


def output(label: str) -> str:
    return (TMP / f"{label}.out").read_text(errors="replace")


class Events:
    """Collects the system's membership events in the background."""

    def __init__(self, system: actorch.ActorSystem) -> None:
        self.seen: list[actorch.MembershipEvent] = []
        self._task = asyncio.ensure_future(self._collect(system))

    async def _collect(self, system: actorch.ActorSystem) -> None:
        async for event in system.events():
            self.seen.append(event)

    def kinds(self, rank: int) -> list[str]:
        return [type(event).__name__ for event in self.seen if getattr(event, "rank", None) == rank]

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def grow(system: actorch.ActorSystem) -> dict[str, Any]:
    events = Events(system)
    started = time.monotonic()
    start_joiner(system, "a")
    start_joiner(system, "b")
    rank_a, rank_b = await joined(system, "a"), await joined(system, "b")
    emit(
        "joined",
        ranks=[rank_a, rank_b],
        nodes=[[info.rank, info.label] for info in system.nodes],
        world_size=system.world_size,
        seconds=time.monotonic() - started,
    )

    work_a = await system.spawn(Worker, args=(str(TMP),), name="work/a", on=rank_a)
    work_b = await system.spawn(Worker, name="work/b", on=rank_b)
    old = await system.spawn(Worker, name="old", on=1)
    emit(
        "spawned",
        where_a=await work_a.call(Worker.where),
        where_b=await work_b.call(Worker.where),
        pids={str(info.rank): info.pid for info in system.nodes},
        from_old_node=await old.call(Worker.lookup, "work/a"),
        from_new_node=await work_b.call(Worker.lookup, "old"),
        events=events.kinds(rank_a),
    )

    # A graceful leave: one call running, a tell queued behind it, one call that outlasts stop_grace.
    running = asyncio.ensure_future(attempt(work_a.call(Worker.nap, 0.5)))
    await asyncio.sleep(0.1)
    work_a.tell(Worker.note, "queued")
    stuck = asyncio.ensure_future(attempt(work_a.call(Worker.nap, 30)))
    await asyncio.sleep(0.05)
    leaving = time.monotonic()
    await system.leave(rank_a)
    left_after = time.monotonic() - leaving
    emit(
        "left",
        running=await running,
        stuck=await stuck,
        told=(TMP / "told").read_text().split() if (TMP / "told").exists() else None,
        on_stop=(TMP / "stopped-work_a").read_text() if (TMP / "stopped-work_a").exists() else None,
        seconds=left_after,
        names=[ref.name for ref in await system.lookup_all("work/*")],
        call_after=await attempt(work_a.call(Worker.where)),
        spawn_after=await attempt(system.spawn(Worker, on=rank_a)),
        nodes=[info.rank for info in system.nodes],
        lost=list(system.lost_nodes),
        world_size=system.world_size,
        exit_code=await exit_code("a"),
        events=events.kinds(rank_a),
    )

    # A joined node killed: the rest goes on, its names vanish.
    os.kill(JOINERS["b"].pid, signal.SIGKILL)
    async with asyncio.timeout(10):
        while rank_b not in system.lost_nodes:  # noqa: ASYNC110 - the system's own view, polled
            await asyncio.sleep(0.02)
    emit(
        "killed",
        names=[ref.name for ref in await system.lookup_all("work/*")],
        call_after=await attempt(work_b.call(Worker.where)),
        old_still_answers=await old.call(Worker.where),
        events=events.kinds(rank_b),
    )

    # The host comes back: a new process joins as a new node.
    start_joiner(system, "b-again")
    rank_again = await joined(system, "b-again")
    again = await system.spawn(Worker, args=(str(TMP),), name="work/b", on=rank_again)
    emit(
        "rejoined",
        rank=rank_again,
        where=await again.call(Worker.where),
        from_old_node=await old.call(Worker.lookup, "work/b"),
        nodes=[info.rank for info in system.nodes],
        events=events.kinds(rank_again),
    )

    # SIGTERM, as a preemptible machine gets before it goes: the node leaves gracefully.
    JOINERS["b-again"].terminate()
    code = await exit_code("b-again")
    emit(
        "terminated",
        exit_code=code,
        on_stop=(TMP / "stopped-work_b").read_text() if (TMP / "stopped-work_b").exists() else None,
        names=[ref.name for ref in await system.lookup_all("work/*")],
        call_after=await attempt(again.call(Worker.where)),
        nodes=[info.rank for info in system.nodes],
        events=events.kinds(rank_again),
    )
    await events.close()
    return {"main": "returned"}


async def tokens(system: actorch.ActorSystem) -> dict[str, Any]:
    start_joiner(system, "wrong", env={"ACTORCH_JOIN_TOKEN": "not-the-token"})
    start_joiner(system, "missing", env={"ACTORCH_JOIN_TOKEN": "<unset>"})
    codes = {label: await exit_code(label, 30) for label in ("wrong", "missing")}
    emit(
        "refused",
        codes=codes,
        outputs={label: output(label) for label in codes},
        nodes=[info.rank for info in system.nodes],
        join_env=sorted(system.join_env()),
    )
    # Not rank 0's to give, and not a node's to leave from rank 0.
    emit("misuse", leave_rank0=await attempt(system.leave()), leave_unknown=await attempt(system.leave(99)))
    # A join racing the end of the system: main returns the moment the newcomer holds a rank and asks.
    start_joiner(system, "late", timeout=5, asking=TMP / "late.asking")
    async with asyncio.timeout(30):
        while not (TMP / "late.asking").exists():  # noqa: ASYNC110 - another process writes it
            await asyncio.sleep(0.005)
    (TMP / "late.pid").write_text(str(JOINERS["late"].pid))
    return {"main": "returned"}


async def churn(system: actorch.ActorSystem) -> dict[str, Any]:
    """4 callers send 4 x 4,000 calls to tallies on the stable nodes, in four phases, each during a churn step."""
    count, phases, per_round, pause = 4000, 4, 25, 0.04
    tallies = [await system.spawn(Tally, on=rank) for rank in (0, 1)]
    callers = [await system.spawn(Caller, on=index % 2) for index in range(4)]
    answered: list[int] = []
    phase = iter(range(phases))

    def send() -> asyncio.Future[list[int]]:
        """Start one phase of every caller's messages."""
        size = count // phases
        start = next(phase) * size
        return asyncio.gather(
            *(
                caller.call(Caller.send, tallies[index % 2], f"caller{index}", start, start + size, per_round, pause)
                for index, caller in enumerate(callers)
            )
        )

    churned = []
    for cycle in range(2):
        labels = [f"churn{cycle}-{side}" for side in ("x", "y")]
        sending = send()
        for label in labels:
            start_joiner(system, label)
        ranks = [await joined(system, label) for label in labels]
        for rank in ranks:
            worker = await system.spawn(Worker, name=f"churn/{rank}", on=rank)
            await worker.call(Worker.where)
        answered += await sending
        sending = send()
        await asyncio.sleep(0.1)
        await asyncio.gather(*(system.leave(rank) for rank in ranks))
        leave_overlapped = not sending.done()
        answered += await sending
        churned.append(
            {"ranks": ranks, "codes": [await exit_code(label) for label in labels], "overlapped": leave_overlapped}
        )
    reports = [await tally.call(Tally.report) for tally in tallies]
    seen: dict[str, list[int]] = {}
    for report in reports:
        for sender, numbers in report.items():
            seen.setdefault(sender, []).extend(numbers)
    emit(
        "churn",
        answered=sum(answered),
        received=sum(len(numbers) for numbers in seen.values()),
        lost=sum(len(set(range(count)) - set(numbers)) for numbers in seen.values()) + count * (4 - len(seen)),
        duplicated=sum(len(numbers) - len(set(numbers)) for numbers in seen.values()),
        in_order=all(numbers == sorted(numbers) for numbers in seen.values()),
        churned=churned,
        nodes=[info.rank for info in system.nodes],
    )
    return {"main": "returned"}


async def agent(system: actorch.ActorSystem) -> dict[str, Any]:
    learner = await system.spawn(Agent, args=(small_policy,), kwargs={"seed": 0})
    for index in range(2):
        await system.spawn(
            Observer, args=("corridor:corridor",), kwargs={"seed": index}, name=f"rl/observers/{index}", on=1
        )
    first = await learner.call(Agent.run_episode, 8)
    start_joiner(system, "more-observers")
    rank = await joined(system, "more-observers")
    for index in (2, 3):
        await system.spawn(
            Observer, args=("corridor:corridor",), kwargs={"seed": index}, name=f"rl/observers/{index}", on=rank
        )
    second = await learner.call(Agent.run_episode, 8)
    await system.leave(rank)
    third = await learner.call(Agent.run_episode, 8)
    emit(
        "agent",
        observers=[first.observers, second.observers, third.observers],
        episodes=[first.episode, second.episode, third.episode],
        steps=[first.steps, second.steps, third.steps],
        exit_code=await exit_code("more-observers"),
    )
    return {"main": "returned"}


async def remote(system: actorch.ActorSystem) -> dict[str, Any]:
    """A node joins from another host: spawn there, call it, find it by name from here."""
    rank = await joined(system, "host-b", within=60)
    worker = await system.spawn(Worker, name="remote/worker", on=rank)
    found = await system.lookup("remote/worker")
    emit(
        "remote",
        rank=rank,
        where=await worker.call(Worker.where),
        found=await found.call(Worker.where),
        reverse=await worker.call(Worker.lookup, "remote/worker"),
        host=next(info.host for info in system.nodes if info.rank == rank),
    )
    return {"main": "returned"}


async def shared(system: actorch.ActorSystem) -> dict[str, Any]:
    """``grow``, ``churn`` and ``agent`` in turn: each ends with only the launch's nodes 0 and 1 in the system."""
    for mode in (grow, churn, agent):
        await mode(system)
    return {"main": "returned"}


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    modes = {"grow": grow, "tokens": tokens, "churn": churn, "agent": agent, "shared": shared, "remote": remote}
    try:
        return await modes[MODE](system)
    except BaseException:
        for proc in JOINERS.values():  # a failed check must not leave a joiner behind
            if proc.poll() is None:
                proc.kill()
        raise


if __name__ == "__main__":
    sizes = {"grow": 2, "tokens": 1, "churn": 2, "agent": 2, "shared": 2, "remote": 1}
    where = {"host": os.environ["ELASTIC_HOST"], "port": int(os.environ["ELASTIC_PORT"])} if MODE == "remote" else {}
    result = actorch.run(main, world_size=sizes[MODE], elastic=True, stop_grace=1.5, lookup_timeout=10.0, **where)
    print("RETURNED", __import__("json").dumps(result), flush=True)
