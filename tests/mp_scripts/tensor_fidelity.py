"""Tensors drawn by hypothesis cross a real torch RPC world and back, bitwise as sent; the unsendable are refused.

Usage: ``python tensor_fidelity.py lane|no-lane EXAMPLES`` (two processes). Rank 0
draws ``EXAMPLES`` payloads (one to three tensors of any kind, see
``tensor_cases``), sends each to an actor on rank 1, which reports the bits of
what arrived and sends it back; both must equal the bits sent. Small tensors
ride inside the message bytes. With ``lane``, messages take the fast lane and
larger tensors shared memory (the two nodes share this host); with
``no-lane``, messages take torch RPC and the tensors its own path (the system
leaves shared memory out: ``channels=("staged",)``). Then each kind that has
no faithful form is sent once and must be refused with ``SerializationError``
naming the argument, the process still serving.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from typing import Any

import torch
from actors import describe, emit
from hypothesis import HealthCheck, given, settings
from tensor_cases import TensorEcho, bits, payloads

import actorch

LANE = sys.argv[1] == "lane"
EXAMPLES = int(sys.argv[2])
CALL_SECONDS = 30.0


def check_property(loop: asyncio.AbstractEventLoop, echo: actorch.ActorRef[TensorEcho]) -> int:
    """Run the property in this thread (hypothesis drives plain functions), each call on the system's loop."""
    sent = 0

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(payloads())
    def arrives_as_sent(payload: list[torch.Tensor]) -> None:
        nonlocal sent
        expected = [bits(tensor) for tensor in payload]
        call = asyncio.run_coroutine_threadsafe(echo.call(TensorEcho.echo, payload), loop)
        arrived, returned = call.result(CALL_SECONDS)
        sent += 1
        assert arrived == expected, "a tensor arrived at the actor other than it was sent"
        assert [bits(tensor) for tensor in returned] == expected, "a tensor came back other than it was sent"

    arrives_as_sent()
    return sent


async def fidelity(system: actorch.ActorSystem, echo: actorch.ActorRef[TensorEcho]) -> None:
    before = system.statistics()
    started = time.monotonic()
    try:
        sent = await asyncio.to_thread(check_property, asyncio.get_running_loop(), echo)
    except BaseException as exc:
        emit("fidelity", failed=describe(exc), traceback="".join(traceback.format_exception(exc)))
        if not isinstance(exc, Exception):
            raise
        return
    after = system.statistics()
    emit(
        "fidelity",
        calls=sent,
        seconds=time.monotonic() - started,
        lane_bundles=after["lane_bundles_sent"] - before["lane_bundles_sent"],
        tensor_bytes=after["tensor_bytes_sent"] - before["tensor_bytes_sent"],
        channels={
            name: counts["tensors"] - before["channels"][name]["tensors"] for name, counts in after["channels"].items()
        },
    )


def unsendable() -> dict[str, torch.Tensor]:
    """One tensor of each kind that has no faithful form (torch RPC aborts the sender on the first two)."""
    return {
        "nested-strided": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        "mkldnn": torch.ones(3).to_mkldnn(),
        "meta": torch.empty(3, device="meta"),
        "sparse-requires-grad": torch.ones(2, 2).to_sparse().requires_grad_(),
    }


async def refusals(system: actorch.ActorSystem, echo: actorch.ActorRef[TensorEcho]) -> None:
    outcomes: dict[str, Any] = {}
    for kind, tensor in unsendable().items():
        try:
            async with asyncio.timeout(CALL_SECONDS):
                await echo.call(TensorEcho.echo, [torch.ones(1), tensor])
        except Exception as exc:
            outcomes[kind] = describe(exc)
        else:
            outcomes[kind] = "sent"
    async with asyncio.timeout(CALL_SECONDS):
        arrived, _ = await echo.call(TensorEcho.echo, [torch.arange(3)])
    emit("refusals", outcomes=outcomes, still_serving=arrived == [bits(torch.arange(3))])


async def main(system: actorch.ActorSystem) -> str:
    echo = await system.spawn(TensorEcho, on=1)
    await fidelity(system, echo)
    await refusals(system, echo)
    return "returned"


if __name__ == "__main__":
    channels = None if LANE else ("staged",)
    returned = actorch.run(main, world_size=2, fast_lane=LANE, stop_grace=1.0, channels=channels)
    print("RETURNED " + json.dumps(returned), flush=True)
