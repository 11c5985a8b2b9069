"""Crossing threads: ``Inbox`` and the torch/asyncio future bridges."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import torch

from actorch._transport.bridge import Inbox, to_asyncio, to_torch


async def poll_until(condition: Callable[[], bool], seconds: float = 10) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 - other threads change the state, no event to wait on
            await asyncio.sleep(0.001)


async def wait_for_count(items: list[object], count: int) -> None:
    await poll_until(lambda: len(items) >= count)


async def test_inbox_delivers_items_from_one_thread_in_order() -> None:
    received: list[int] = []
    inbox: Inbox[int] = Inbox(asyncio.get_running_loop(), received.append)
    thread = threading.Thread(target=lambda: [inbox.post(i) for i in range(10_000)])
    thread.start()
    await wait_for_count(received, 10_000)
    thread.join()
    await asyncio.sleep(0.01)
    assert received == list(range(10_000))


async def test_inbox_delivers_every_item_of_many_threads_each_in_order() -> None:
    received: list[tuple[int, int]] = []
    inbox: Inbox[tuple[int, int]] = Inbox(asyncio.get_running_loop(), received.append)
    barrier = threading.Barrier(4)

    def produce(thread_id: int) -> None:
        barrier.wait()
        for i in range(2_000):
            inbox.post((thread_id, i))

    threads = [threading.Thread(target=produce, args=(thread_id,)) for thread_id in range(4)]
    for thread in threads:
        thread.start()
    await wait_for_count(received, 8_000)
    for thread in threads:
        thread.join()
    await asyncio.sleep(0.01)
    assert len(received) == 8_000
    for thread_id in range(4):
        assert [i for tid, i in received if tid == thread_id] == list(range(2_000))


async def test_inbox_runs_its_handler_on_the_loop_thread() -> None:
    threads: list[threading.Thread] = []
    inbox: Inbox[int] = Inbox(asyncio.get_running_loop(), lambda _: threads.append(threading.current_thread()))
    poster = threading.Thread(target=inbox.post, args=(1,))
    poster.start()
    await wait_for_count(threads, 1)
    poster.join()
    assert threads == [threading.current_thread()]


def test_inbox_post_to_a_closed_loop_is_dropped_quietly() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    received: list[int] = []
    inbox: Inbox[int] = Inbox(loop, received.append)
    inbox.post(1)
    inbox.post(2)
    assert received == []


async def test_to_asyncio_gives_the_result_set_from_another_thread() -> None:
    future: torch.futures.Future[int] = torch.futures.Future()
    bridged = to_asyncio(future, asyncio.get_running_loop())
    threading.Timer(0.01, future.set_result, args=(42,)).start()
    async with asyncio.timeout(5):
        assert await bridged == 42


async def test_to_asyncio_raises_the_exception_set_from_another_thread() -> None:
    future: torch.futures.Future[int] = torch.futures.Future()
    bridged = to_asyncio(future, asyncio.get_running_loop())
    threading.Timer(0.01, future.set_exception, args=(KeyError("gone"),)).start()
    async with asyncio.timeout(5):
        with pytest.raises(KeyError, match="gone"):
            await bridged


async def test_to_asyncio_settles_from_an_already_completed_future() -> None:
    future: torch.futures.Future[str] = torch.futures.Future()
    future.set_result("ready")
    async with asyncio.timeout(5):
        assert await to_asyncio(future, asyncio.get_running_loop()) == "ready"


async def test_to_asyncio_ignores_a_result_after_the_asyncio_side_was_cancelled() -> None:
    future: torch.futures.Future[int] = torch.futures.Future()
    bridged = to_asyncio(future, asyncio.get_running_loop())
    bridged.cancel()
    future.set_result(1)
    await asyncio.sleep(0.01)
    assert bridged.cancelled()


async def settled(future: torch.futures.Future[object]) -> None:
    await poll_until(future.done, seconds=2)


async def test_to_torch_gives_the_result_of_the_asyncio_future() -> None:
    source: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    bridged = to_torch(source)
    assert not bridged.done()
    source.set_result({"a": 1})
    await settled(bridged)
    assert bridged.value() == {"a": 1}


async def test_to_torch_gives_the_exception_of_the_asyncio_future() -> None:
    source: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    bridged = to_torch(source)
    source.set_exception(ValueError("bad"))
    await settled(bridged)
    with pytest.raises(ValueError, match="bad"):
        bridged.value()


async def test_to_torch_completes_with_an_error_when_the_asyncio_future_is_cancelled() -> None:
    source: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    bridged = to_torch(source)
    source.cancel()
    await settled(bridged)
    # torch futures only carry Exception instances, so any error naming the cancellation will do.
    with pytest.raises(BaseException) as info:  # noqa: PT011
        bridged.value()
    assert "cancel" in f"{type(info.value).__name__} {info.value}".lower()


async def test_to_torch_result_can_be_awaited_from_another_thread() -> None:
    source: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    bridged = to_torch(source)
    seen: list[object] = []
    waiter = threading.Thread(target=lambda: seen.append(bridged.wait()))
    waiter.start()
    source.set_result(7)
    await wait_for_count(seen, 1)
    waiter.join()
    assert seen == [7]
