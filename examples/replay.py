"""Observers on two worker processes fill a sharded prioritized replay buffer while a learner trains from it.

Run it with ``python examples/replay.py``. Ranks 1 and 2 each host one
``PrioritizedReplayBuffer`` shard and one observer that plays a small contextual
bandit and writes its transitions to the shard beside it (a same-node call, no
copy over the wire). Rank 0 is the learner: it samples batches across both
shards through a ``ShardedReplayBuffer``, fits a linear model of the reward
with importance-weighted loss, and gives every sampled transition its new
priority (its absolute error). Every second it prints the transitions written
per second, the samples drawn per second and the loss; on a terminal a progress
bar counts the seconds (``--no-progress`` for none).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
from _progress import ProgressBar

import actorch
from actorch.replay import PrioritizedReplayBuffer, ReplayBuffer, ShardedReplayBuffer

STATE, ACTIONS = 8, 4


def true_rewards() -> torch.Tensor:
    """The bandit's hidden reward weights, the same on every node."""
    return torch.randn(STATE, ACTIONS, generator=torch.Generator().manual_seed(0))


class Observer(actorch.Actor):
    """Plays the bandit with random actions and writes what it sees to its node's shard."""

    def __init__(self, shard: actorch.ActorRef[PrioritizedReplayBuffer], batch: int = 64) -> None:
        self.shard = shard
        self.batch = batch
        self.weights = true_rewards()
        self.generator = torch.Generator().manual_seed(self.system.rank)

    async def run(self, seconds: float) -> int:
        """Write batches of transitions for ``seconds``; return how many were written."""
        written = 0
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            state = torch.randn(self.batch, STATE, generator=self.generator)
            action = torch.randint(ACTIONS, (self.batch,), generator=self.generator)
            noise = 0.1 * torch.randn(self.batch, generator=self.generator)
            reward = (state @ self.weights).gather(1, action[:, None]).squeeze(1) + noise
            await self.shard.call(ReplayBuffer.extend, {"state": state, "action": action, "reward": reward})
            written += self.batch
            await asyncio.sleep(0.005)  # an environment takes time; and lets the learner's calls in
        return written


async def added(shards: list[actorch.ActorRef[PrioritizedReplayBuffer]]) -> int:
    """Transitions written to all shards so far (evicted ones included)."""
    statistics = await asyncio.gather(*(shard.call(PrioritizedReplayBuffer.statistics) for shard in shards))
    return sum(entry["added"] for entry in statistics)


async def learn(
    client: ShardedReplayBuffer,
    shards: list[actorch.ActorRef[PrioritizedReplayBuffer]],
    seconds: float,
    batch_size: int,
    bar: ProgressBar,
) -> dict[str, float]:
    """Sample, fit, reprioritize for ``seconds``; print progress every second."""
    model = torch.zeros(STATE, ACTIONS, requires_grad=True)
    optimizer = torch.optim.SGD([model], lr=0.05)
    for _ in range(200):  # wait (up to 10 s) for the observers' first transitions
        if await client.size() >= batch_size:
            break
        await asyncio.sleep(0.05)
    started = last = time.monotonic()
    added_before, sampled, sampled_before, loss_value = await added(shards), 0, 0, float("nan")
    while (now := time.monotonic()) < started + seconds:
        sample = await client.sample(batch_size)
        assert sample.weights is not None
        predicted = (sample.data["state"] @ model).gather(1, sample.data["action"][:, None]).squeeze(1)
        error = predicted - sample.data["reward"]
        loss = (sample.weights * error.pow(2)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        await client.update_priorities(sample.indices, error.detach().abs())
        sampled += batch_size
        loss_value = loss.item()
        bar.update(completed=now - started)
        if now - last >= 1.0:
            added_now = await added(shards)
            print(
                f"  t={now - started:4.1f}s  in {(added_now - added_before) / (now - last):7,.0f} transitions/s  "
                f"out {(sampled - sampled_before) / (now - last):7,.0f} samples/s  "
                f"held {sum(client.statistics()['sizes'] or [0]):7,}  loss {loss_value:.4f}"
            )
            added_before, sampled_before, last = added_now, sampled, now
    elapsed = time.monotonic() - started
    distance = (model.detach() - true_rewards()).norm().item()
    return {"samples_per_s": sampled / elapsed, "loss": loss_value, "distance": distance}


async def main(system: actorch.ActorSystem) -> None:
    args = parser().parse_args()
    workers = list(range(1, system.world_size)) or [0]
    shards = [
        await system.spawn(
            PrioritizedReplayBuffer,
            args=(args.capacity,),
            kwargs={"alpha": 0.6, "beta": 0.4},
            name=f"replay/{rank}",
            on=rank,
        )
        for rank in workers
    ]
    observers = [await system.spawn(Observer, args=(shard,), on=shard.rank) for shard in shards]
    client = ShardedReplayBuffer(shards, beta=0.4, seed=0)
    print(
        f"{len(observers)} observers on nodes {workers}, one prioritized shard each "
        f"(capacity {args.capacity:,}); learner on node {system.rank}, batch {args.batch_size}"
    )
    started = time.monotonic()
    writing = [asyncio.ensure_future(observer.call(Observer.run, args.seconds)) for observer in observers]
    with ProgressBar(args.seconds, "s", description="learning", enabled=args.progress) as bar:
        result = await learn(client, shards, args.seconds, args.batch_size, bar)
    written = sum(await asyncio.gather(*writing))
    elapsed = time.monotonic() - started
    print(
        f"done in {elapsed:.1f} s: {written:,} transitions in ({written / elapsed:,.0f}/s), "
        f"{result['samples_per_s']:,.0f} samples/s out, final loss {result['loss']:.4f}, "
        f"|model - true weights| = {result['distance']:.3f}"
    )
    for shard in shards:
        statistics = await shard.call(PrioritizedReplayBuffer.statistics)
        print(
            f"  {shard.name} on node {shard.rank}: holds {statistics['size']:,} of {statistics['capacity']:,}, "
            f"{statistics['added']:,} added, {statistics['sampled']:,} sampled, max priority "
            f"{statistics['max_priority']:.2f}"
        )


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parsed.add_argument("--seconds", type=float, default=8.0)
    parsed.add_argument("--batch-size", type=int, default=256)
    parsed.add_argument("--capacity", type=int, default=100_000)
    parsed.add_argument("--world-size", type=int, default=3)
    parsed.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="a bar on a terminal")
    return parsed


if __name__ == "__main__":
    actorch.run(main, world_size=parser().parse_args().world_size)
