"""TensorDicts cross a real torch RPC world as arguments and results, their tensors on the tensor path.

Usage: ``python tensordicts.py`` (three processes). Every check prints one
``RESULT {json}`` line; the test asserts on them. ``echo``: rank 0 sends a
TensorDict (nested, locked, of several dtypes, with a large tensor and a
non-tensor entry) to an actor on rank 1, which describes what arrived and
returns a TensorDict of its own; the nodes' byte counts show where the large
tensor went. ``collected``: a collector on rank 1 plays a batch, rank 0 turns it
into a TensorDict (``Batch.to_tensordict``) and a learner on rank 2 takes it.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from actors import run_checks
from corridor import FramePolicy, Pixels
from tensordict import TensorDict

import actorch
from actorch.rl import Collector

LARGE = 1 << 20  # bytes of the large tensor: far above what the codec inlines


def describe(td: Any) -> dict[str, Any]:
    """What a TensorDict holds, as JSON: its type, batch size, device, lock, tensors and non-tensor entry."""
    leaves = td.items(include_nested=True, leaves_only=True)
    return {
        "type": type(td).__name__,
        "batch_size": list(td.batch_size),
        "device": str(td.device),
        "locked": td.is_locked,
        "nested": type(td["next"]).__name__,
        "nested_batch_size": list(td["next"].batch_size),
        "leaves": {key_name(key): describe_leaf(leaf) for key, leaf in leaves},
        "env": td["env"],
    }


def key_name(key: str | tuple[str, ...]) -> str:
    """A nested key as ``next/reward``."""
    return "/".join(key) if isinstance(key, tuple) else key


def describe_leaf(leaf: torch.Tensor) -> list[Any]:
    """A tensor's dtype, shape and sum."""
    return [str(leaf.dtype), list(leaf.shape), float(leaf.double().sum())]


class Learner(actorch.Actor):
    """Takes TensorDicts and gives them back, as a learner in TorchRL's layout would."""

    async def describe(self, td: Any) -> dict[str, Any]:
        return describe(td)

    async def advantages(self, td: Any) -> Any:
        """A TensorDict of its own: the rewards doubled, under the batch's batch size and device."""
        reward = td["next", "reward"]
        return TensorDict(
            {"advantage": reward * 2, "seen": TensorDict({"large": td["large"] + 1}, batch_size=td.batch_size)},
            batch_size=td.batch_size,
            device=td.device,
        )

    async def rollout(self, td: Any) -> dict[str, Any]:
        """What a loss module reads of a collector's batch."""
        return {
            "type": type(td).__name__,
            "batch_size": list(td.batch_size),
            "keys": sorted(key_name(key) for key in td.keys(include_nested=True, leaves_only=True)),
            "observation": str(td["observation"].dtype),
            "frames": int(td["next", "reward"].numel()),
            "observation_sum": int(td["observation"].long().sum()),
        }

    async def statistics(self) -> dict[str, int]:
        return self.system.statistics()


def sample() -> Any:
    td = TensorDict(
        {
            "observation": torch.arange(24, dtype=torch.uint8).view(2, 3, 4),
            "action": torch.tensor([[0, 1, 0], [1, 1, 0]]),
            "large": torch.ones(2, 3, LARGE // 24, dtype=torch.float32),
            "next": TensorDict(
                {
                    "reward": torch.full((2, 3, 1), 0.5, dtype=torch.float64),
                    "done": torch.tensor([[[False], [True], [False]], [[False], [False], [True]]]),
                },
                batch_size=[2, 3],
            ),
        },
        batch_size=[2, 3],
        device="cpu",
    )
    td.set_non_tensor("env", "Pixels")
    return td.lock_()


async def check_echo(system: actorch.ActorSystem) -> dict[str, Any]:
    learner = await system.spawn(Learner, name="td/learner", on=1)
    sent = sample()
    before = system.statistics()
    arrived = await learner.call(Learner.describe, sent)
    between = system.statistics()
    returned = await learner.call(Learner.advantages, sent)
    after = system.statistics()
    await learner.stop()
    return {
        "sent": describe(sent),
        "arrived": arrived,
        "returned": {
            "type": type(returned).__name__,
            "batch_size": list(returned.batch_size),
            "device": str(returned.device),
            "advantage": returned["advantage"].tolist(),
            "large": float(returned["seen", "large"].sum()),
            "large_elements": returned["seen", "large"].numel(),
        },
        "sent_bytes": between["bytes_sent"] - before["bytes_sent"],
        "sent_tensor_bytes": between["tensor_bytes_sent"] - before["tensor_bytes_sent"],
        "returned_bytes": after["bytes_received"] - between["bytes_received"],
    }


async def check_collected(system: actorch.ActorSystem) -> dict[str, Any]:
    collector = await system.spawn(
        Collector, args=(Pixels, FramePolicy), kwargs={"num_envs": 2, "frames_per_batch": 16, "logits": True}, on=1
    )
    learner = await system.spawn(Learner, name="td/rollouts", on=2)
    batches = [batch async for batch in collector.stream(Collector.batches, 1)]
    rollout = batches[0].to_tensordict()
    seen = await learner.call(Learner.rollout, rollout)
    await collector.stop()
    await learner.stop()
    return {"seen": seen, "observation_sum": int(batches[0].observations.long().sum())}


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    return await run_checks(system, [("echo", check_echo), ("collected", check_collected)])


if __name__ == "__main__":
    result = actorch.run(main, world_size=3)
    print("RETURNED " + json.dumps(result), flush=True)
