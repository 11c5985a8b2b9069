"""Crossing threads: ``Inbox`` and ``in_daemon_thread``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from actorch._transport.bridge import Inbox, in_daemon_thread


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


async def test_in_daemon_thread_runs_the_function_in_a_daemon_thread_of_its_own() -> None:
    ran_in: list[threading.Thread] = []
    async with asyncio.timeout(5):
        await in_daemon_thread(lambda: ran_in.append(threading.current_thread()))
    assert len(ran_in) == 1
    assert ran_in[0] is not threading.current_thread()
    assert ran_in[0].daemon


async def test_in_daemon_thread_raises_what_the_function_raised() -> None:
    def refuse() -> None:
        raise ConnectionError("no rendezvous")

    async with asyncio.timeout(5):
        with pytest.raises(ConnectionError, match="no rendezvous"):
            await in_daemon_thread(refuse)


async def test_in_daemon_thread_leaves_the_loop_free_while_the_function_blocks() -> None:
    release = threading.Event()
    waiting = asyncio.ensure_future(in_daemon_thread(lambda: release.wait(5)))
    await asyncio.sleep(0.02)
    assert not waiting.done()  # the loop ran this coroutine while the thread was blocked
    release.set()
    async with asyncio.timeout(5):
        await waiting
