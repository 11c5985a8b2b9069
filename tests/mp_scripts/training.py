"""The parameter server across real processes: sharded sync rounds, gated pulls, RRefs.

Usage: ``python training.py [--strict]``; three processes, shards on ranks 1 and 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

# isort: off
import actorch
import torch
import torch.distributed.autograd as dist_autograd
from actors import attempt, emit
from torch.distributed.optim import DistributedOptimizer

# isort: on

MODEL = "models:tiny_model"


class Trainer(actorch.Actor):
    """Pushes constant gradients through a client, or trains through RRefs."""

    async def push_constant(self, pattern: str, value: float) -> dict[str, Any]:
        client = actorch.params.ParameterClient(await self.system.lookup_all(pattern))
        start = await client.pull()
        assert start is not None
        after = await client.push({name: torch.full_like(t, value) for name, t in start.items()})
        return {
            "versions": client.versions,
            "moved": {name: (start[name] - after[name]).mean().item() for name in after},
        }

    async def autograd_step(self, server_name: str) -> dict[str, Any]:
        server = await self.system.lookup(server_name)
        model = await server.call(actorch.ParameterServer.module_rref)
        rrefs = await server.call(actorch.ParameterServer.parameter_rrefs)
        return await asyncio.to_thread(self._step, model, rrefs)

    @staticmethod
    def _step(model: Any, rrefs: list[Any]) -> dict[str, Any]:
        optimizer = DistributedOptimizer(torch.optim.SGD, rrefs, lr=1.0)
        with dist_autograd.context() as context_id:
            out = model.rpc_sync().forward(torch.ones(1, 3))
            dist_autograd.backward(context_id, [out.sum()])
            optimizer.step(context_id)
        return {"rrefs": len(rrefs), "owners": sorted({r.owner().id for r in rrefs})}


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"optimizer_kwargs": {"lr": 0.5}, "mode": "sync", "trainers": 2}
    shards = [
        await system.spawn(
            actorch.ParameterServer, args=(MODEL,), kwargs={**kwargs, "shard": (i, 2)}, name=f"ps/{i}", on=1 + i
        )
        for i in range(2)
    ]
    trainers = [await system.spawn(Trainer, on=rank) for rank in (2, 1)]
    results = await asyncio.gather(
        trainers[0].call(Trainer.push_constant, "ps/*", 1.0), trainers[1].call(Trainer.push_constant, "ps/*", 3.0)
    )
    emit("sync_shards", results=results)

    client = actorch.params.ParameterClient(shards)
    first = await client.pull()
    emit(
        "gated_pull",
        full=first is not None and sorted(first),
        again=await client.pull(),
        versions=client.versions,
        direct=await attempt(shards[0].call(actorch.ParameterServer.pull, since=1)),
    )

    single = await system.spawn(actorch.ParameterServer, args=(MODEL,), name="single", on=1)
    before = await single.call(actorch.ParameterServer.pull)
    assert before is not None
    step = await attempt(trainers[0].call(Trainer.autograd_step, "single"))
    after = await single.call(actorch.ParameterServer.pull, since=before.version)
    emit(
        "rrefs",
        step=step,
        changed=after is not None and any(not torch.equal(after.tensors[n], before.tensors[n]) for n in after.tensors),
    )
    return {"main": "returned"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strict", action="store_true")
    print("RETURNED " + json.dumps(actorch.run(main, world_size=3, strict=parser.parse_args().strict)), flush=True)
