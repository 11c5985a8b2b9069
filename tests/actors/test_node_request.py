"""``NodeRequest``: node processes to start as one value, checked as it is made, from ``add_nodes`` to the pool.

An in-process world starts no processes, so the pool of rank 0 is replaced by
one that keeps what it is asked and refuses it; what it kept is what
``add_nodes`` (or a spawn in a process of its own) sent, through the placer
and the node service. ``test_pool_multiprocess.py`` starts real ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import actorch
from actorch._actors.node_request import NodeRequest
from actorch._actors.where import Where
from actorch._base.codec import Codec
from actorch.testing import LocalWorld


class KeepingPool:
    """A node's pool that keeps each request it is given and starts nothing."""

    def __init__(self) -> None:
        self.asked: list[NodeRequest] = []

    async def add(self, request: NodeRequest) -> list[int]:
        self.asked.append(request)
        raise actorch.UnsupportedError("kept, not started")

    async def build_owner(self, build: Callable[[], Awaitable[Any]]) -> Any:
        return await build()

    async def follow_owner(self, actor_id: int) -> None:
        """No process of this node is an actor's own."""


class Sim(actorch.Actor):
    async def rank(self) -> int:
        return self.system.rank


@pytest.fixture
def pool(world: LocalWorld) -> KeepingPool:
    """Rank 0's pool, replaced by one that keeps what it is asked."""
    keeping = KeepingPool()
    world._hosts[0].pool = keeping  # type: ignore[assignment]
    return keeping


def test_a_node_request_travels_through_the_codec_unchanged() -> None:
    codec = Codec(strict=True)  # natively, as strict systems need
    request = NodeRequest(2, "env", {"env_slots": 4}, {"OMP_NUM_THREADS": "1"}, "gpu-b", ("own/0", "own/1"))
    assert codec.decode(*codec.encode(request)) == request
    assert codec.decode(*codec.encode(NodeRequest(1))) == NodeRequest(1)


def test_a_node_request_keeps_its_amounts_as_floats_and_says_each_processs_owner() -> None:
    request = NodeRequest(2, resources={"env_slots": 4}, owners=["a", "b"])  # type: ignore[arg-type]
    assert request.resources == {"env_slots": 4.0}
    assert request.owners == ("a", "b")
    assert request.owner_of_each() == ["a", "b"]
    assert NodeRequest(3).owner_of_each() == [None, None, None]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"count": 0}, ValueError, "add_nodes(count=...) must be an int >= 1, not 0"),
        ({"count": True}, ValueError, "add_nodes(count=...) must be an int >= 1, not True"),
        ({"label": ""}, ValueError, "add_nodes(label=...) must be a non-empty str or None, not ''"),
        ({"host": 3}, ValueError, "add_nodes(host=...) must be a non-empty str or None, not 3"),
        ({"resources": {"slots": -1}}, ValueError, "add_nodes(resources=...)['slots'] must be a finite number >= 0"),
        ({"resources": 4}, TypeError, "add_nodes(resources=...) must be a mapping"),
        ({"env": {"A": 1}}, ValueError, "add_nodes(env=...) must map str to str, not {'A': 1}"),
        ({"owners": ("a",)}, ValueError, "add_nodes(2): 1 owners given"),
    ],
)
def test_a_node_request_refuses_what_it_cannot_ask(options: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error) as refused:
        NodeRequest(**{"count": 2, **options})
    assert str(refused.value).startswith(message)


async def test_add_nodes_sends_one_request_to_the_pool_of_rank_0(world: LocalWorld, pool: KeepingPool) -> None:
    with pytest.raises(actorch.UnsupportedError, match="kept, not started"):
        await world[1].add_nodes(2, label="env", resources={"env_slots": 4}, env={"OMP_NUM_THREADS": "1"})
    assert pool.asked == [NodeRequest(2, "env", {"env_slots": 4.0}, {"OMP_NUM_THREADS": "1"})]


async def test_processes_of_their_own_are_asked_for_in_one_request_naming_their_owners(
    world: LocalWorld, pool: KeepingPool
) -> None:
    own = Where(process="own", label="sims", env={"OMP_NUM_THREADS": "1"})
    with pytest.raises(actorch.UnsupportedError, match="kept, not started"):
        await world[2].spawn_group(Sim, 2, name="rl/sims", on=own)
    with pytest.raises(actorch.UnsupportedError, match="kept, not started"):
        await world[2].spawn(Sim, on=own)
    assert pool.asked == [
        NodeRequest(2, "sims", env={"OMP_NUM_THREADS": "1"}, owners=("rl/sims/0", "rl/sims/1")),
        NodeRequest(1, "sims", env={"OMP_NUM_THREADS": "1"}, owners=("Sim",)),
    ]


async def test_add_nodes_refuses_a_bad_request_before_asking_any_node(world: LocalWorld, pool: KeepingPool) -> None:
    with pytest.raises(ValueError, match=r"add_nodes\(label=\.\.\.\) must be a non-empty str"):
        await world[0].add_nodes(1, label=" ")
    assert pool.asked == []
