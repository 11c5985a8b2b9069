"""Distributed autograd contexts on the event loop: binding one to a coroutine's steps, and the public helper."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from actorch._transport.autograd import (
    CONTEXT_CLASH_HINT,
    NO_CONTEXT,
    bound,
    current_context_id,
    explain_context_clash,
    force_context_id,
    supported,
)

pytestmark = pytest.mark.skipif(not supported(), reason="this build of torch does not export the context accessors")


async def test_bound_coroutine_holds_its_context_only_while_it_runs() -> None:
    seen: list[tuple[str, int]] = []

    async def inside() -> str:
        seen.append(("inside", current_context_id()))
        await asyncio.sleep(0)
        seen.append(("inside again", current_context_id()))
        return "value"

    async def beside() -> None:
        seen.append(("beside", current_context_id()))

    results = await asyncio.gather(bound(inside(), 41), beside())
    assert results[0] == "value"
    assert seen == [("inside", 41), ("beside", NO_CONTEXT), ("inside again", 41)]
    assert current_context_id() == NO_CONTEXT


async def test_bound_coroutine_restores_the_context_the_thread_held_before() -> None:
    async def inside() -> int:
        return current_context_id()

    previous = force_context_id(5)
    try:
        assert await bound(inside(), 9) == 9
        assert current_context_id() == 5
    finally:
        force_context_id(previous)


async def test_bound_coroutine_raises_its_error_with_the_context_let_go() -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        await bound(failing(), 3)
    assert current_context_id() == NO_CONTEXT


async def test_bound_coroutine_is_cancelled_inside_its_context() -> None:
    cleaned: list[int] = []
    started = asyncio.Event()

    async def waiting() -> None:
        try:
            started.set()
            await asyncio.sleep(60)
        finally:
            cleaned.append(current_context_id())

    task = asyncio.ensure_future(bound(waiting(), 12))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [12]
    assert current_context_id() == NO_CONTEXT


def test_in_autograd_context_needs_a_system_on_torch_rpc() -> None:
    code = textwrap.dedent(
        """
        import actorch

        async def step(context_id):
            return context_id

        async def main(system):
            try:
                await actorch.in_autograd_context(step)
            except actorch.UnsupportedError as exc:
                print("refused:", exc)

        actorch.run(main)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "refused: distributed autograd needs a system on torch RPC" in done.stdout, done.stderr


def test_explain_context_clash_notes_the_fix_once_on_torchs_error_only() -> None:
    clash = RuntimeError("Already have an autograd context id for this thread.")
    explain_context_clash(clash)
    explain_context_clash(clash)  # a batch's error is answered once per call: still one note
    assert clash.__notes__ == [CONTEXT_CLASH_HINT]
    assert "actorch.in_autograd_context" in CONTEXT_CLASH_HINT
    other = RuntimeError("something else")
    explain_context_clash(other)
    explain_context_clash(ValueError("Already have an autograd context id for this thread."))
    assert not hasattr(other, "__notes__")
