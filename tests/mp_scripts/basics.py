"""Most multi-process checks in one world of three processes (rank 0 + two workers).

Usage: ``python basics.py TMPDIR``. Every check prints one ``RESULT {json}`` line
with what it observed (or ``failed`` with the exception); the test asserts on
them. Actors that write files in ``on_stop`` are left running so the test can
check that shutdown ran their hook.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import torch
from actors import (
    BadStart,
    Counter,
    CustomError,
    Finder,
    Gauge,
    Ping,
    Recorder,
    Sender,
    Slow,
    Stopper,
    Store,
    WideGauge,
    attempt,
    attempt_now,
    describe,
    run_checks,
    send_interleaved,
)

import actorch

TMP = Path(sys.argv[1])
Check = Callable[[actorch.ActorSystem], Awaitable[dict[str, Any]]]


async def check_call_tell(system: actorch.ActorSystem) -> dict[str, Any]:
    c = await system.spawn(Counter, args=(10,), name="counters/a", on=1)
    typed = await c.call(Counter.add, 5)
    by_name = await c.call("add", 5)
    keyword = await c.call(Counter.add, k=2)
    default = await c.call("add")
    c.tell(Counter.add, 100)
    after_tell = await c.call(Counter.get)
    recorder = await system.spawn(Recorder, on=2)
    for index in range(50):
        recorder.tell(Recorder.append, "main", index)
    told = [index for _, index in await recorder.call(Recorder.entries)]
    return {
        "typed": typed,
        "by_name": by_name,
        "keyword": keyword,
        "default": default,
        "after_tell": after_tell,
        "told": told,
    }


async def check_spawn_where(system: actorch.ActorSystem) -> dict[str, Any]:
    one = await system.spawn(Counter, name="where/one", on=1)
    two = await system.spawn(Counter, name="where/two", on=2)
    zero = await system.spawn(Counter, name="where/zero")
    return {
        "refs": [[ref.name, ref.rank] for ref in (zero, one, two)],
        "where": [await ref.call(Counter.where) for ref in (zero, one, two)],
        "nodes": [[node.rank, node.pid] for node in system.nodes],
        "main_pid": os.getpid(),
        "rank": system.rank,
        "world_size": system.world_size,
    }


async def check_lookup(system: actorch.ActorSystem) -> dict[str, Any]:
    target = await system.spawn(Counter, args=(7,), name="lookup/target", on=1)
    same = await system.lookup("lookup/target")
    finder = await system.spawn(Finder, on=2)
    return {
        "same": same == target,
        "found": [same.name, same.rank, await same.call(Counter.get)],
        "from_actor": await finder.call(Finder.find, "lookup/target"),
    }


async def check_lookup_wait(system: actorch.ActorSystem) -> dict[str, Any]:
    finder = await system.spawn(Finder, on=2)
    from_main = asyncio.ensure_future(system.lookup("late/x"))
    from_actor = asyncio.ensure_future(finder.call(Finder.find, "late/x"))
    await asyncio.sleep(0.5)
    early = [from_main.done(), from_actor.done()]
    late = await system.spawn(Counter, args=(3,), name="late/x", on=1)
    async with asyncio.timeout(10):
        got = await from_main
        found_by_actor = await from_actor
    return {"early_done": early, "from_main": [got.name, got.rank, got == late], "from_actor": found_by_actor}


async def check_lookup_all(system: actorch.ActorSystem) -> dict[str, Any]:
    for value, (name, rank) in enumerate(
        [("pool/w1", 1), ("pool/w2", 2), ("pool/sub/w3", 1), ("other/w4", 2), ("pool/x10", 2)]
    ):
        await system.spawn(Counter, args=(value,), name=name, on=rank)
    star = await system.lookup_all("pool/*")
    return {
        "star": [ref.name for ref in star],
        "star_ranks": [ref.rank for ref in star],
        "star_values": [await ref.call(Counter.get) for ref in star],
        "double_star": [ref.name for ref in await system.lookup_all("pool/**")],
        "question": [ref.name for ref in await system.lookup_all("pool/w?")],
        "nothing": [ref.name for ref in await system.lookup_all("nothing/*")],
    }


async def check_names(system: actorch.ActorSystem) -> dict[str, Any]:
    original = await system.spawn(Counter, args=(1,), name="taken/a", on=1)
    taken_other = await attempt(system.spawn(Counter, name="taken/a", on=2))
    taken_same = await attempt(system.spawn(Counter, name="taken/a", on=1))
    taken_local = await attempt(system.spawn(Counter, name="taken/a"))
    invalid = {}
    for name in ["bad name", "a//b", "../x", "x/./y", "", "x" * 300, "caf\u00e9", "trailing/"]:
        invalid[name] = await attempt(system.spawn(Counter, name=name, on=2))
    bad_start = await attempt(system.spawn(BadStart, name="badstart/x", on=1))
    reused = await system.spawn(Counter, args=(9,), name="badstart/x", on=2)
    return {
        "taken_other": taken_other,
        "taken_same": taken_same,
        "taken_local": taken_local,
        "original_value": await original.call(Counter.get),
        "lookup_same": (await system.lookup("taken/a")) == original,
        "listed": [ref.name for ref in await system.lookup_all("taken/**")],
        "invalid": invalid,
        "lookup_invalid": await attempt(system.lookup("bad name")),
        "pattern_invalid": await attempt(system.lookup_all("bad pattern")),
        "bad_start": bad_start,
        "reused": [reused.rank, await reused.call(Counter.get)],
    }


async def check_stop_name(system: actorch.ActorSystem) -> dict[str, Any]:
    target = await system.spawn(Counter, args=(5,), name="temp/s", on=2)
    finder = await system.spawn(Finder, on=1)
    before_main = await system.lookup("temp/s")  # now cached on rank 0
    before_actor = await finder.call(Finder.find, "temp/s")  # now cached on rank 1
    await target.stop()

    async def lookup_briefly() -> Any:
        async with asyncio.timeout(1.0):
            return await system.lookup("temp/s")

    after_main = await attempt(lookup_briefly())
    after_actor = await finder.call(Finder.find_within, "temp/s", 1.0)
    call_after = await attempt(target.call(Counter.get))
    call_via_lookup_ref = await attempt(before_main.call(Counter.get))
    stop_again = await attempt(target.stop())
    listed = [ref.name for ref in await system.lookup_all("temp/*")]
    again = await system.spawn(Counter, args=(6,), name="temp/s", on=1)
    relooked = await system.lookup("temp/s")
    from_actor_again = await finder.call(Finder.find, "temp/s")
    return {
        "before_actor": before_actor,
        "after_main": after_main,
        "after_actor": after_actor,
        "call_after": call_after,
        "call_via_lookup_ref": call_via_lookup_ref,
        "stop_again": stop_again,
        "listed": listed,
        "respawned": [relooked == again, relooked.rank, await relooked.call(Counter.get)],
        "from_actor_again": from_actor_again,
    }


async def check_fifo(system: actorch.ActorSystem) -> dict[str, Any]:
    recorder = await system.spawn(Recorder, on=1)
    sender = await system.spawn(Sender, on=2)
    remote = asyncio.ensure_future(sender.call(Sender.blast, recorder, "actor", 500))
    local_calls = await send_interleaved(recorder, "main", 500)
    remote_calls = await remote
    log = await recorder.call(Recorder.entries)
    by_caller: dict[str, list[int]] = {"main": [], "actor": []}
    for caller, index in log:
        by_caller[caller].append(index)
    return {"calls": [local_calls, remote_calls], "total": len(log), **by_caller}


async def check_concurrency(system: actorch.ActorSystem) -> dict[str, Any]:
    serial = await system.spawn(Gauge, on=1)
    wide = await system.spawn(WideGauge, on=2)
    started = time.monotonic()
    await asyncio.gather(*(serial.call(Gauge.work, 0.3) for _ in range(4)))
    serial_seconds = time.monotonic() - started
    started = time.monotonic()
    await asyncio.gather(*(wide.call(Gauge.work, 0.3) for _ in range(6)))
    wide_seconds = time.monotonic() - started
    return {
        "serial_peak": await serial.call(Gauge.peak_seen),
        "serial_seconds": serial_seconds,
        "wide_peak": await wide.call(Gauge.peak_seen),
        "wide_seconds": wide_seconds,
    }


async def check_reentrancy(system: actorch.ActorSystem) -> dict[str, Any]:
    a = await system.spawn(Ping, on=1)
    b = await system.spawn(Ping, on=2)
    local = await system.spawn(Ping)  # on rank 0, chain crosses to rank 2 and back
    started = time.monotonic()
    sequential = [await a.call(Ping.ping_via, b, value) for value in range(3)]
    sequential_seconds = time.monotonic() - started
    started = time.monotonic()
    concurrent = await asyncio.gather(
        *(a.call(Ping.ping_via, b, value) for value in range(5)),
        *(local.call(Ping.ping_via, b, value) for value in range(5, 8)),
    )
    concurrent_seconds = time.monotonic() - started
    return {
        "sequential": sequential,
        "sequential_seconds": sequential_seconds,
        "concurrent": list(concurrent),
        "concurrent_seconds": concurrent_seconds,
    }


async def check_deadline(system: actorch.ActorSystem) -> dict[str, Any]:
    slow = await system.spawn(Slow, on=1)

    async def with_asyncio_timeout() -> Any:
        async with asyncio.timeout(0.5):
            return await slow.call(Slow.slow, "d1", 30)

    async def with_anyio_fail_after() -> Any:
        with anyio.fail_after(0.5):
            return await slow.call(Slow.slow, "d2", 30)

    async def in_time() -> Any:
        async with asyncio.timeout(5):
            return await slow.call(Slow.slow, "d3", 0.1)

    timed_out = await attempt(with_asyncio_timeout())
    # The actor handles one message at a time: this answers only once "d1" is cancelled.
    started = time.monotonic()
    async with asyncio.timeout(5):
        history_1 = await slow.call(Slow.history)
    history_1_seconds = time.monotonic() - started
    failed_after = await attempt(with_anyio_fail_after())
    async with asyncio.timeout(5):
        history_2 = await slow.call(Slow.history)
    ok = await attempt(in_time())
    return {
        "timed_out": timed_out,
        "history_1": history_1,
        "history_1_seconds": history_1_seconds,
        "failed_after": failed_after,
        "history_2": history_2,
        "in_time": ok,
    }


async def check_cancel(system: actorch.ActorSystem) -> dict[str, Any]:
    slow = await system.spawn(Slow, on=2)
    task = asyncio.ensure_future(slow.call(Slow.slow, "c1", 30))
    await asyncio.sleep(0.5)
    task.cancel()
    started = time.monotonic()
    try:
        await task
    except asyncio.CancelledError:
        outcome = "cancelled"
    except Exception as exc:
        outcome = f"raised {type(exc).__name__}: {exc}"
    else:
        outcome = "completed"
    async with asyncio.timeout(5):
        history = await slow.call(Slow.history)
    return {"outcome": outcome, "history": history, "history_seconds": time.monotonic() - started}


async def check_remote_errors(system: actorch.ActorSystem) -> dict[str, Any]:
    c = await system.spawn(Counter, args=(2,), on=1)
    message = "h\u00e9llo w\u00f6rld \u2713 \u65e5\u672c\u8a9e \u2014 \U0001f525\nsecond line"
    out: dict[str, Any] = {"sent_message": message}
    try:
        await c.call(Counter.explode, message)
    except ValueError as exc:
        out["value_error"] = {
            "is_remote_error": isinstance(exc, actorch.RemoteError),
            "is_actorch_error": isinstance(exc, actorch.ActorchError),
            "message": str(exc),
            "type_name": getattr(exc, "type_name", None),
            "remote_traceback": getattr(exc, "remote_traceback", None),
        }
    except Exception as exc:
        out["value_error"] = {"wrong": describe(exc)}
    try:
        await c.call(Counter.explode_custom, "custom \u00fc")
    except CustomError as exc:
        out["custom"] = {
            "is_remote_error": isinstance(exc, actorch.RemoteError),
            "message": str(exc),
            "type_name": getattr(exc, "type_name", None),
        }
    except Exception as exc:
        out["custom"] = {"wrong": describe(exc)}
    local_only = await attempt(c.call(Counter.explode_local))
    out["local_only"] = local_only
    try:
        await c.call(Counter.explode_local)
    except actorch.RemoteError as exc:
        out["local_only_type_name"] = exc.type_name
    try:
        await system.spawn(BadStart, on=2)
    except ValueError as exc:
        out["bad_start"] = {"is_remote_error": isinstance(exc, actorch.RemoteError), "message": str(exc)}
    except Exception as exc:
        out["bad_start"] = {"wrong": describe(exc)}
    out["still_serving"] = await c.call(Counter.add, 1)
    return out


async def check_endpoint_errors(system: actorch.ActorSystem) -> dict[str, Any]:
    c = await system.spawn(Counter, args=(4,), on=2)
    return {
        "unknown": await attempt(c.call("nope")),
        "private": await attempt(c.call("_private")),
        "too_many": await attempt(c.call("add", 1, 2, 3)),
        "bad_keyword": await attempt(c.call(Counter.add, kk=1)),
        "handler_type_error": await attempt(c.call(Counter.add, "x")),
        "tell_unknown": attempt_now(lambda: c.tell("nope")),
        "tell_private": attempt_now(lambda: c.tell("_private")),
        "tell_bad_args": attempt_now(lambda: c.tell(Counter.add, 1, 2)),
        "still_serving": await c.call(Counter.add, 1),
    }


async def check_stopped(system: actorch.ActorSystem) -> dict[str, Any]:
    c = await system.spawn(Counter, on=1)
    explicit = TMP / "on_stop_explicit"
    stopper = await system.spawn(Stopper, args=(str(explicit),), on=2)
    await c.stop()
    await stopper.stop()
    return {
        "call": await attempt(c.call(Counter.get)),
        "tell": attempt_now(lambda: c.tell(Counter.add, 1)),
        "stopper_call": await attempt(stopper.call(Stopper.where)),
        "on_stop_ran_before_stop_returned": explicit.exists(),
    }


async def check_tensors(system: actorch.ActorSystem) -> dict[str, Any]:
    store = await system.spawn(Store, on=1)
    big = torch.randn(16 * 1024 * 1024)  # 64 MiB of float32
    started = time.monotonic()
    back = await store.call(Store.echo, big)
    seconds = time.monotonic() - started
    nested = {"a": [torch.arange(10), (torch.ones(2, 2, dtype=torch.float64), "x")], "b": 3}
    nested_back = await store.call(Store.echo, nested)
    view = torch.arange(12).reshape(3, 4).t()
    view_back = await store.call(Store.echo, view)
    for _ in range(5):
        sent = torch.zeros(4 * 1024 * 1024)
        store.tell(Store.keep, sent)
        sent.fill_(1.0)  # the actor must still see zeros
    return {
        "big_equal": bool(torch.equal(back, big)),
        "big_meta": [str(back.dtype), list(back.shape), back.data_ptr() != big.data_ptr()],
        "big_seconds": seconds,
        "nested_types": [type(nested_back).__name__, type(nested_back["a"][1]).__name__],
        "nested_equal": bool(
            torch.equal(nested_back["a"][0], nested["a"][0])
            and torch.equal(nested_back["a"][1][0], nested["a"][1][0])
            and nested_back["a"][1][0].dtype == torch.float64
            and nested_back["a"][1][1] == "x"
            and nested_back["b"] == 3
        ),
        "view_equal": bool(torch.equal(view_back, view)),
        "told_sums": await store.call(Store.kept_sums),
    }


async def check_lanes(system: actorch.ActorSystem) -> dict[str, Any]:
    """Messages that go by the fast lane and by torch RPC, interleaved, arrive in the order they were sent."""
    recorder = await system.spawn(Recorder, on=1)
    before = system.statistics()
    remote_before = await recorder.call(Recorder.node_statistics)
    calls = []
    for index in range(300):
        if index % 7 == 0:  # 64 KiB that requires grad: too large to ride inside the message, so torch RPC carries it
            tensor = torch.zeros(16384, requires_grad=True)
            calls.append(asyncio.ensure_future(recorder.call(Recorder.append_with, "main", index, tensor)))
            await asyncio.sleep(0)
        else:
            recorder.tell(Recorder.append, "main", index)
    await asyncio.gather(*calls)
    after = system.statistics()
    remote_after = await recorder.call(Recorder.node_statistics)
    return {
        "order": [index for _, index in await recorder.call(Recorder.entries)],
        "lane_bundles": after["lane_bundles_sent"] - before["lane_bundles_sent"],
        "tensor_bytes": after["tensor_bytes_sent"] - before["tensor_bytes_sent"],
        "remote_lane_bundles": remote_after["lane_bundles_sent"] - remote_before["lane_bundles_sent"],
    }


CHECKS: list[tuple[str, Check]] = [
    ("call_tell", check_call_tell),
    ("spawn_where", check_spawn_where),
    ("lookup", check_lookup),
    ("lookup_wait", check_lookup_wait),
    ("lookup_all", check_lookup_all),
    ("names", check_names),
    ("stop_name", check_stop_name),
    ("fifo", check_fifo),
    ("concurrency", check_concurrency),
    ("reentrancy", check_reentrancy),
    ("deadline", check_deadline),
    ("cancel", check_cancel),
    ("remote_errors", check_remote_errors),
    ("endpoint_errors", check_endpoint_errors),
    ("stopped", check_stopped),
    ("tensors", check_tensors),
    ("lanes", check_lanes),
]


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    # Left running: shutdown must run their on_stop on every rank.
    for rank in range(system.world_size):
        await system.spawn(Stopper, args=(str(TMP / f"on_stop_rank{rank}"),), name=f"stoppers/{rank}", on=rank)
    return await run_checks(system, CHECKS)


if __name__ == "__main__":
    result = actorch.run(main, world_size=3)
    print("RETURNED " + json.dumps(result), flush=True)
