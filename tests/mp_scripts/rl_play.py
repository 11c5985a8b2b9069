"""Agent and observers over real torch RPC: the agent on rank 0, one observer on each worker.

Usage: ``python rl_play.py``. Every check prints one ``RESULT {json}`` line; the
test asserts on them. Observers build the corridor of ``corridor.py`` from its
import path on their own node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import torch
from actors import attempt, run_checks
from torch import nn

import actorch
from actorch import Agent, Observer

Check = Callable[[actorch.ActorSystem], Awaitable[dict[str, Any]]]


def small_policy() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=-1))


class CountingAgent(Agent):
    """Records the batch size of every policy forward."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forwards: list[int] = []

    def act(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.forwards.append(states.shape[0])
        return super().act(states)

    async def forward_sizes(self) -> list[int]:
        return self.forwards


class PidObserver(Observer):
    async def pid(self) -> int:
        return os.getpid()


async def seat_observers(system: actorch.ActorSystem) -> list[int]:
    pids = []
    for rank in (1, 2):
        ref = await system.spawn(
            PidObserver, args=("corridor:corridor",), kwargs={"seed": rank}, name=f"rl/observers/{rank}", on=rank
        )
        pids.append(await ref.call(PidObserver.pid))
    return pids


async def check_batched(system: actorch.ActorSystem) -> dict[str, Any]:
    pids = await seat_observers(system)
    agent = await system.spawn(CountingAgent, args=(small_policy,), kwargs={"seed": 0})
    stats = await agent.call(Agent.run_episode)
    fixed = await agent.call(Agent.run_episode, 12)
    return {
        "pids": pids,
        "main_pid": os.getpid(),
        "observers": stats.observers,
        "steps": [stats.steps, fixed.steps],
        "forwards": await agent.call(CountingAgent.forward_sizes),
    }


async def check_plain(system: actorch.ActorSystem) -> dict[str, Any]:
    agent = await system.spawn(CountingAgent, args=(small_policy,), kwargs={"batch": False})
    stats = await agent.call(Agent.run_episode)
    return {"steps": stats.steps, "forwards": await agent.call(CountingAgent.forward_sizes)}


async def check_learning(system: actorch.ActorSystem) -> dict[str, Any]:
    agent = await system.spawn(Agent, args=(small_policy,), kwargs={"seed": 1, "lr": 0.05})
    rewards = [(await agent.call(Agent.run_episode)).reward for _ in range(40)]
    return {"first": rewards[0], "last": rewards[-5:]}


async def check_new_observer_joins(system: actorch.ActorSystem) -> dict[str, Any]:
    await system.spawn(Observer, args=("corridor:corridor",), name="rl/observers/1b", on=1)
    agent = await system.spawn(CountingAgent, args=(small_policy,))
    stats = await agent.call(Agent.run_episode)
    names = await agent.call(Agent.observers)
    return {"observers": stats.observers, "names": names, "forwards": await agent.call(CountingAgent.forward_sizes)}


async def check_broken_observer(system: actorch.ActorSystem) -> dict[str, Any]:
    broken = await system.spawn(Observer, args=("corridor:broken_corridor",), name="rl/observers/broken", on=2)
    agent = await system.spawn(Agent, args=(small_policy,))
    outcome = await attempt(agent.call(Agent.run_episode))
    await broken.stop()
    after = await agent.call(Agent.run_episode)
    return {"outcome": outcome, "after": after.observers}


CHECKS: list[tuple[str, Check]] = [
    ("batched", check_batched),
    ("plain", check_plain),
    ("learning", check_learning),
    ("joins", check_new_observer_joins),
    ("broken", check_broken_observer),
]


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    return await run_checks(system, CHECKS)


if __name__ == "__main__":
    result = actorch.run(main, world_size=3)
    print("RETURNED " + json.dumps(result), flush=True)
