"""The fit predicate: why a node is refused, in the one wording placement and relocation share."""

from __future__ import annotations

from typing import Any, cast

import pytest

from actorch._actors.placement.fit import EPSILON, LEAVING, LOST, by_node, capacity, lacks_capacity, lacks_free, refusal
from actorch._actors.placement.gpus import GpuShare
from actorch._actors.ref import ActorRef, make_ref
from actorch._actors.restart import Restart
from actorch._actors.spawn_request import SpawnRequest
from actorch._actors.where import Where
from actorch._base.codec import Codec
from actorch._transport.base import NodeInfo

PLAIN = NodeInfo(1, "node1", "h1", 11, resources={"cpus": 4.0})
ENV = NodeInfo(2, "node2", "h2", 12, ("cuda:0",), label="env", resources={"cpus": 2.0, "gpus": 1.0, "slots": 2.0})
OWNED = NodeInfo(3, "node3", "h1", 13, label="env", owner="learner")


def ask(where: Where, device: str | None = None, gpus: int = 0) -> SpawnRequest:
    return SpawnRequest("actors:Counter", device=device, gpus=gpus, where=where)


def test_refusal_is_none_for_a_node_that_fits() -> None:
    where = Where(label="env", host="h2", cpus=2, gpus=1, resources={"slots": 2})
    assert refusal(ENV, ask(where, "cuda:0"), {}) is None
    assert refusal(PLAIN, ask(Where()), {}) is None


def test_refusal_names_an_unavailable_node_by_its_reason() -> None:
    assert refusal(ENV, ask(Where()), {2: LOST}) == "lost"
    assert refusal(ENV, ask(Where()), {2: LEAVING}) == "leaving the system"


def test_refusal_names_the_owner_of_an_actors_own_process_whatever_is_asked() -> None:
    assert refusal(OWNED, ask(Where(label="env")), {}) == "the own process of learner"


def test_refusal_names_the_label_the_node_has_and_the_one_asked() -> None:
    assert refusal(PLAIN, ask(Where(label="env")), {}) == "label None, not 'env'"
    assert refusal(ENV, ask(Where(label="learner")), {}) == "label 'env', not 'learner'"


def test_refusal_names_the_host_the_node_is_on_and_the_one_asked() -> None:
    assert refusal(PLAIN, ask(Where(host="h2")), {}) == "on host 'h1', not 'h2'"


def test_refusal_names_the_device_the_node_lacks_and_those_it_has() -> None:
    assert refusal(PLAIN, ask(Where(), "cuda:1"), {}) == "has no cuda:1 (no GPU)"
    assert refusal(ENV, ask(Where(), "cuda:1"), {}) == "has no cuda:1 (cuda:0)"
    assert refusal(PLAIN, ask(Where(), "cpu"), {}) is None


def test_refusal_names_the_first_resource_the_node_has_too_little_of() -> None:
    assert refusal(PLAIN, ask(Where(cpus=8)), {}) == "has 4 cpus, needs 8 cpus"
    assert refusal(PLAIN, ask(Where(gpus=1)), {}) == "has 0 gpus, needs 1 gpus"
    assert refusal(ENV, ask(Where(), gpus=2), {}) == "has 1 gpus, needs 2 gpus"  # gpus= asks as Where(gpus=) does
    assert refusal(ENV, ask(Where(resources={"slots": 3})), {}) == "has 2 slots, needs 3 slots"
    assert refusal(PLAIN, ask(Where(resources={"slots": 1})), {}) == "has 0 slots, needs 1 slots"


def test_refusal_checks_in_order_availability_owner_label_host_device_amounts() -> None:
    where = Where(label="learner", host="elsewhere", cpus=64)
    assert refusal(OWNED, ask(where, "cuda:3"), {3: LOST}) == "lost"
    assert refusal(OWNED, ask(where, "cuda:3"), {}) == "the own process of learner"
    assert refusal(ENV, ask(where, "cuda:3"), {}) == "label 'env', not 'learner'"
    assert refusal(ENV, ask(Where(host="elsewhere", cpus=64), "cuda:3"), {}) == "on host 'h2', not 'elsewhere'"
    assert refusal(ENV, ask(Where(cpus=64), "cuda:3"), {}) == "has no cuda:3 (cuda:0)"


def test_capacity_counts_gpus_from_the_devices_unless_declared() -> None:
    assert capacity(NodeInfo(0, "node0", "h", 1, ("cuda:0", "cuda:1")))["gpus"] == 2.0
    assert capacity(ENV)["gpus"] == 1.0
    assert capacity(PLAIN) == {"cpus": 4.0, "gpus": 0.0}


def test_amounts_within_the_tolerance_count_as_enough() -> None:
    thirds = 0.1 + 0.2  # 0.30000000000000004
    assert lacks_capacity({"cpus": 0.3}, {"cpus": thirds}) is None
    assert lacks_free({"free": {"cpus": 0.3}, "held": {}}, {"cpus": thirds}) is None
    assert lacks_capacity({"cpus": 1.0}, {"cpus": 1.0 + 10 * EPSILON}) == "has 1 cpus, needs 1 cpus"


def test_lacks_free_names_what_is_short_and_who_holds_it() -> None:
    share = {"free": {"slots": 0.0, "cpus": 3.0}, "held": {"sims/a": {"slots": 1.0}, "other": {"cpus": 1.0}}}
    assert lacks_free(share, {"slots": 1, "cpus": 1}) == "0 slots free, needs 1 slots (held by sims/a)"
    assert lacks_free(share, {"cpus": 3}) is None
    assert lacks_free({"free": {}, "held": {}}, {"slots": 1}) == "0 slots free, needs 1 slots"


def test_a_gpu_share_lacks_in_the_same_words() -> None:
    share = GpuShare(1, ("cuda:0", "cuda:1"), {"cuda:0": "learner/0"})
    assert share.lacks(1) is None
    assert share.lacks(2) == "1 gpus free, needs 2 gpus (held by learner/0)"
    assert share.lacks(3) == "has 2 gpus, needs 3 gpus"
    assert GpuShare(0, ()).lacks(1) == "has 0 gpus, needs 1 gpus"


@pytest.mark.parametrize(
    ("refusals", "text"),
    [({}, "no node"), ({2: "lost", 0: "label None, not 'env'"}, "node 0: label None, not 'env'; node 2: lost")],
)
def test_by_node_lists_every_refusal_by_rank(refusals: dict[int, str], text: str) -> None:
    assert by_node(refusals) == text


def test_a_spawn_request_travels_through_the_codec_unchanged() -> None:
    codec = Codec(strict=True)  # natively, as strict systems need
    where = Where(label="env", cpus=0.5, resources={"slots": 1}, process="own", env={"A": "1"}, wait=True)
    request = SpawnRequest(
        "actors:Counter", (1, "a", (2, 3)), {"k": [4]}, "c/0", Restart(max_restarts=2), "cuda:0", 0, where
    )
    data, tensors = codec.encode(request)
    assert codec.decode(data, tensors) == request
    assert codec.decode(*codec.encode(SpawnRequest("actors:Counter"))) == SpawnRequest("actors:Counter")


def test_a_spawn_request_says_what_its_actor_holds_on_its_node() -> None:
    request = SpawnRequest("actors:Counter", where=Where(cpus=1, gpus=2, resources={"slots": 1}))
    assert request.lent() == 2
    assert request.held() == {"cpus": 1.0, "slots": 1.0}
    assert request.needs() == {"cpus": 1.0, "slots": 1.0, "gpus": 2.0}
    assert SpawnRequest("actors:Counter", gpus=1).needs() == {"gpus": 1.0}
    assert request.qualname == "Counter"
    assert request.named("c/1").name == "c/1"
    assert not request.relocatable
    assert SpawnRequest("a:B", restart=Restart(relocate=True)).relocatable


def test_a_spawn_requests_gpus_are_part_of_its_where() -> None:
    assert SpawnRequest("a:B", gpus=2) == SpawnRequest("a:B", where=Where(gpus=2))
    assert SpawnRequest("a:B", gpus=1, where=Where(rank=1)).where == Where(rank=1, gpus=1)
    with pytest.raises(ValueError, match=r"^spawn\(B\): ask for GPUs in Where\(gpus=...\) or with gpus=, not both$"):
        SpawnRequest("a:B", gpus=1, where=Where(gpus=1))


def test_a_placed_request_no_longer_names_its_node_and_keeps_the_rest() -> None:
    pinned = SpawnRequest("a:B", name="b", gpus=1, where=Where(rank=1, cpus=1))
    assert pinned.placed() == SpawnRequest("a:B", name="b", where=Where(cpus=1, gpus=1))
    described = SpawnRequest("a:B", where=Where(label="env"))
    assert described.placed() is described


def test_refusal_takes_a_node_named_by_rank_as_it_is_if_what_the_actor_holds_fits() -> None:
    assert refusal(OWNED, ask(Where(rank=3)), {}) is None  # another actor's own process
    assert refusal(PLAIN, ask(Where(rank=1), "cuda:1"), {}) is None  # the spawn checks the device itself
    assert refusal(PLAIN, ask(Where(rank=1, cpus=8)), {}) == "has 4 cpus, needs 8 cpus"
    assert refusal(PLAIN, ask(Where(rank=1)), {1: LOST}) == "lost"
    assert refusal(OWNED, ask(Where(rank=1)), {}) == "the own process of learner"  # named, but not this node


# ---------------------------------------------------------------------- affinity: near and apart from


def a_ref(rank: int, name: str | None = "x", actor_id: int = 5) -> ActorRef[Any]:
    return make_ref(cast(Any, None), rank, actor_id, name, "actors:Counter")


def test_refusal_keeps_near_to_the_node_of_that_actor() -> None:
    near = ask(Where(near=a_ref(2)))
    assert refusal(ENV, near, {}) is None
    assert refusal(PLAIN, near, {}) == "not the node of x (node 2)"
    assert refusal(PLAIN, near, {2: LOST}) == "not the node of x (node 2, lost)"


def test_refusal_follows_where_the_asker_knows_the_actor_lives() -> None:
    near = ask(Where(near=a_ref(2)))
    assert refusal(PLAIN, near, {}, lambda ref: 1) is None
    assert refusal(ENV, near, {}, lambda ref: 1) == "not the node of x (node 1)"
    assert refusal(ENV, near, {}, lambda ref: None) == "not the node of x, which lives on no node now"


def test_refusal_keeps_apart_from_the_nodes_of_those_actors() -> None:
    apart = ask(Where(apart_from=[a_ref(1, "a"), a_ref(2, "b")]))
    assert refusal(PLAIN, apart, {}) == "the node of a"
    assert refusal(ENV, apart, {}) == "the node of b"
    assert refusal(NodeInfo(4, "node4", "h", 14), apart, {}) is None
    assert refusal(ENV, ask(Where(apart_from=a_ref(2, None))), {}) == "the node of <ActorRef actor Counter#5 on node 2>"


def test_refusal_checks_affinity_after_label_and_host_and_before_the_device() -> None:
    assert refusal(PLAIN, ask(Where(label="env", near=a_ref(2))), {}) == "label None, not 'env'"
    assert refusal(PLAIN, ask(Where(near=a_ref(2)), "cuda:0"), {}) == "not the node of x (node 2)"


def test_where_takes_a_ref_or_a_list_of_refs_to_keep_apart_from() -> None:
    ref = a_ref(2)
    assert Where(apart_from=ref).apart_from == (ref,)
    assert Where(apart_from=[ref, a_ref(1, "y")]).apart == (ref, a_ref(1, "y"))
    assert Where().apart == ()
    assert repr(Where(near=ref)) == "Where(near=<ActorRef actor 'x' (Counter) on node 2>)"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"near": "learner"}, "Where(near=...) must be an actor's ref (ActorRef) or None, not 'learner'"),
        ({"apart_from": "rl/*"}, "Where(apart_from=...) must be an actor's ref or a list of refs, not 'rl/*'"),
        ({"apart_from": 3}, "Where(apart_from=...) must be an actor's ref or a list of refs, not 3"),
        ({"apart_from": [a_ref(1), None]}, "Where(apart_from=...) must hold actors' refs only, not None"),
        (
            {"near": a_ref(1), "process": "own"},
            "Where(near=...) places on an actor's node, not in a process of its own (process='own')",
        ),
        (
            {"near": a_ref(1), "apart_from": [a_ref(1)]},
            "Where(near=..., apart_from=...): <ActorRef actor 'x' (Counter) on node 1> cannot be both",
        ),
    ],
)
def test_where_refuses_affinity_it_cannot_ask(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=r"^Where\(") as refused:
        Where(**options)
    assert str(refused.value) == message
