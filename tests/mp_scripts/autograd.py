"""Distributed autograd through actor calls, in every shape a pipeline takes.

Usage: ``python autograd.py``; three processes, a stage actor on ranks 1 and 2.
Each check runs a forward pass through actors inside a distributed autograd
context, a backward from rank 0, and reports the gradient each remote stage
received in that context (zero or missing means the autograd link was lost).
The last check kills rank 2 between the forward pass and the backward.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import traceback
from typing import Any

# isort: off
import actorch
import torch
import torch.distributed.autograd as dist_autograd
from actors import run_checks

# isort: on

RPC_TIMEOUT = 10.0


class Stage(actorch.Actor):
    """One stage of a pipeline: a small linear layer whose gradients a test reads back."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.layer = torch.nn.Linear(4, 4)

    async def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    async def forward_after_waiting(self, x: torch.Tensor) -> torch.Tensor:
        await asyncio.sleep(0.05)  # longer than any reply hold: the reply travels on its own
        await asyncio.to_thread(lambda: None)
        return self.layer(x)

    async def forward_then(self, following: actorch.ActorRef[Stage], x: torch.Tensor) -> torch.Tensor:
        return await following.call(Stage.forward, self.layer(x))

    @actorch.batched(max_batch=4, max_wait=0.05)
    async def forward_batch(self, items: list[torch.Tensor]) -> torch.Tensor:
        return self.layer(torch.stack(items))

    async def forward_rref(self, x_rref: Any) -> Any:
        return self.system.rref(self.layer(x_rref.to_here()))

    async def forward_from_rref(self, x_rref: Any) -> torch.Tensor:
        return self.layer(x_rref.to_here())

    async def hold_raw_context(self, seconds: float) -> int:
        with dist_autograd.context() as context_id:  # current across the await: the node's thread is taken
            await asyncio.sleep(seconds)
            return int(context_id)

    async def gradient_norms(self, context_id: int) -> list[float]:
        found = dist_autograd.get_gradients(context_id)
        return [float(found[p].norm()) if p in found else 0.0 for p in self.layer.parameters()]


async def backward(context_id: int, loss: torch.Tensor) -> None:
    await asyncio.to_thread(dist_autograd.backward, context_id, [loss])


async def norms(stages: list[actorch.ActorRef[Stage]], context_id: int) -> list[list[float]]:
    return [await stage.call(Stage.gradient_norms, context_id) for stage in stages]


def check(name: str, forward: Any, used: tuple[int, ...] = (0,)) -> tuple[str, Any]:
    """A check that runs ``forward(stages, x)`` in torch's own context and reports the stages' gradients."""

    async def run(system: actorch.ActorSystem) -> dict[str, Any]:
        stages = [await system.lookup("stage/1"), await system.lookup("stage/2")]
        x = torch.ones(2, 4, requires_grad=True)
        with dist_autograd.context() as context_id:
            out = await forward(system, stages, x)
            await backward(context_id, out.sum())
            received = await norms([stages[i] for i in used], context_id)
            local = dist_autograd.get_gradients(context_id).get(x)
        return {"norms": received, "input_grad": local is not None and float(local.norm()) > 0}

    return name, run


async def plain(system: Any, stages: list[Any], x: torch.Tensor) -> torch.Tensor:
    return await stages[0].call(Stage.forward, x)


async def in_flight(system: Any, stages: list[Any], x: torch.Tensor) -> torch.Tensor:
    outs = await asyncio.gather(*(stages[0].call(Stage.forward, x * (i + 1)) for i in range(4)))
    return torch.stack(outs).sum(0)


async def relayed(system: Any, stages: list[Any], x: torch.Tensor) -> torch.Tensor:
    return await stages[1].call(Stage.forward, await stages[0].call(Stage.forward, x))


async def waiting(system: Any, stages: list[Any], x: torch.Tensor) -> torch.Tensor:
    return await stages[0].call(Stage.forward_after_waiting, x)


async def chained(system: Any, stages: list[Any], x: torch.Tensor) -> torch.Tensor:
    return await stages[0].call(Stage.forward_then, stages[1], x)


async def batched(system: Any, stages: list[Any], x: torch.Tensor) -> torch.Tensor:
    outs = await asyncio.gather(*(stages[0].call(Stage.forward_batch, row) for row in x))
    return torch.stack(outs)


async def through_rrefs(system: Any, stages: list[Any], x: torch.Tensor) -> torch.Tensor:
    y_rref = await stages[0].call(Stage.forward_rref, system.rref(x))
    return await stages[1].call(Stage.forward_from_rref, y_rref)


async def two_contexts(system: actorch.ActorSystem) -> dict[str, Any]:
    """Two tasks of rank 0, each in a context of its own, overlapping at their awaits."""
    stages = [await system.lookup("stage/1"), await system.lookup("stage/2")]
    both_inside = asyncio.Barrier(2)

    async def step(context_id: int, stage: actorch.ActorRef[Stage], scale: float) -> dict[str, Any]:
        out = await stage.call(Stage.forward_after_waiting, torch.full((2, 4), scale))
        await both_inside.wait()  # both contexts are open now
        await backward(context_id, out.sum())
        return {"context": context_id, "norms": await stage.call(Stage.gradient_norms, context_id)}

    first, second = await asyncio.gather(
        actorch.in_autograd_context(step, stages[0], 1.0), actorch.in_autograd_context(step, stages[1], 2.0)
    )
    return {"contexts": [first["context"], second["context"]], "norms": [first["norms"], second["norms"]]}


async def clash(system: actorch.ActorSystem) -> dict[str, Any]:
    """Two actors of rank 1 each open torch's own context: the second opener hears the cause and the fix."""
    first = await system.spawn(Stage, args=(3,), on=1)
    second = await system.spawn(Stage, args=(4,), on=1)
    outcomes = await asyncio.gather(
        first.call(Stage.hold_raw_context, 0.5), second.call(Stage.hold_raw_context, 0.0), return_exceptions=True
    )
    error = outcomes[1]
    return {
        "first": outcomes[0] if isinstance(outcomes[0], int) else repr(outcomes[0]),
        "second_is_runtime_error": isinstance(error, RuntimeError),
        "second_printed": "".join(traceback.format_exception(error)) if isinstance(error, BaseException) else None,
    }


async def lost_node(system: actorch.ActorSystem) -> dict[str, Any]:
    """A backward whose gradients must go to a node that died fails, within torch's RPC timeout at worst."""
    stages = [await system.lookup("stage/1"), await system.lookup("stage/2")]
    with dist_autograd.context() as context_id:
        out = await relayed(system, stages, torch.ones(2, 4, requires_grad=True))
        os.kill(system.nodes[2].pid, signal.SIGKILL)
        started = time.monotonic()
        try:
            await backward(context_id, out.sum())
        except RuntimeError as exc:
            return {"raised": type(exc).__name__, "after": time.monotonic() - started, "message": str(exc)[:200]}
    return {"raised": None}


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    for rank in (1, 2):
        await system.spawn(Stage, args=(rank,), name=f"stage/{rank}", on=rank)
    checks = [
        check("plain", plain),
        check("in_flight", in_flight),
        check("relayed", relayed, used=(0, 1)),
        check("waiting", waiting),
        check("chained", chained, used=(0, 1)),
        check("batched", batched),
        check("rrefs", through_rrefs, used=(0, 1)),
        ("two_contexts", two_contexts),
        ("clash", clash),
        ("lost_node", lost_node),  # last: it kills rank 2
    ]
    return await run_checks(system, checks)


if __name__ == "__main__":
    print(
        "RETURNED " + json.dumps(actorch.run(main, world_size=3, transport=actorch.TorchRpc(timeout=RPC_TIMEOUT))),
        flush=True,
    )
