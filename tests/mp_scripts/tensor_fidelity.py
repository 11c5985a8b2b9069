"""Tensors drawn by hypothesis cross a real torch RPC world and back, bitwise as sent; the unsendable are refused.

Usage: ``python tensor_fidelity.py MODE EXAMPLES`` (two processes). Rank 0
draws ``EXAMPLES`` payloads (one to three tensors of any kind, see
``tensor_cases``), sends each to an actor on rank 1, which reports the bits of
what arrived and sends it back; both must equal the bits sent. Small tensors
ride inside the message bytes. With ``lane``, messages take the fast lane and
larger tensors shared memory (the two nodes share this host); with
``no-lane``, messages take torch RPC and the tensors its own path (the system
leaves shared memory out: ``channels=("staged",)``). The ``cuda-ipc``,
``cuda-map`` and ``cuda-staged`` modes (two processes sharing ``cuda:0``)
move each drawn tensor that can be to the GPU first, half of them into a
view of a large storage, and send them by CUDA IPC, through a device map, or
staged through the host (``cuda-staged-shm``: through a segment of it, in
chunks that land while the message travels); empty ones among them travel
as metadata. Then each
kind that has no faithful form is sent once and must be refused with
``SerializationError`` naming the argument, the process still serving.
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
from hypothesis import strategies as st
from tensor_cases import TensorEcho, bits, payloads

import actorch

MODE = sys.argv[1]
LANE = MODE != "no-lane"
EXAMPLES = int(sys.argv[2])
CALL_SECONDS = 30.0
SETTINGS: dict[str, dict[str, Any]] = {
    "lane": {"transport": actorch.TorchRpc()},
    "no-lane": {"transport": actorch.TorchRpc(lane=False), "channels": ("staged",)},
    "cuda-ipc": {"transport": actorch.TorchRpc(device_maps=None)},
    "cuda-map": {"transport": actorch.TorchRpc(device_maps="auto"), "channels": ("device_map",)},
    "cuda-staged": {"transport": actorch.TorchRpc(device_maps=None), "channels": ("staged",)},
    "cuda-staged-shm": {"transport": actorch.TorchRpc(device_maps=None), "channels": ("shm", "staged")},
}


def on_gpu(tensor: torch.Tensor, inside_large: bool) -> torch.Tensor:
    """``tensor`` on ``cuda:0`` (in a view of a larger storage if ``inside_large``); as it is if it cannot go."""
    try:
        if tensor.layout is not torch.strided or tensor.is_nested or tensor.is_quantized:
            return tensor.to("cuda:0")
        moved = tensor.to("cuda:0")
        if not inside_large or not moved.numel():
            return moved
        large = torch.zeros(moved.numel() + (1 << 18), dtype=moved.dtype, device="cuda:0")
        view = large[1024 : 1024 + moved.numel()].view(moved.shape)
        view.copy_(moved)
        return view
    except (RuntimeError, NotImplementedError):  # a kind CUDA does not hold (quantized): it stays on the host
        return tensor


def check_property(loop: asyncio.AbstractEventLoop, echo: actorch.ActorRef[TensorEcho]) -> int:
    """Run the property in this thread (hypothesis drives plain functions), each call on the system's loop."""
    sent = 0

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(payloads(), st.booleans())
    def arrives_as_sent(payload: list[torch.Tensor], inside_large: bool) -> None:
        nonlocal sent
        expected = [bits(tensor) for tensor in payload]
        if MODE.startswith("cuda"):
            payload = [on_gpu(tensor, inside_large) for tensor in payload]
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
    echo = await system.spawn(TensorEcho, on=1, device="cuda:0" if MODE.startswith("cuda") else None)
    await fidelity(system, echo)
    await refusals(system, echo)
    return "returned"


if __name__ == "__main__":
    returned = actorch.run(main, world_size=2, stop_grace=1.0, **SETTINGS[MODE])
    print("RETURNED " + json.dumps(returned), flush=True)
