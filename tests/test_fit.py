"""The fit predicate: why a node is refused, in the one wording placement and relocation share."""

from __future__ import annotations

import pytest

from actorch._actors.fit import EPSILON, LEAVING, LOST, by_node, capacity, lacks_capacity, lacks_free, refusal
from actorch._actors.placement import GpuShare
from actorch._actors.where import Where
from actorch._transport.base import NodeInfo

PLAIN = NodeInfo(1, "node1", "h1", 11, resources={"cpus": 4.0})
ENV = NodeInfo(2, "node2", "h2", 12, ("cuda:0",), label="env", resources={"cpus": 2.0, "gpus": 1.0, "slots": 2.0})
OWNED = NodeInfo(3, "node3", "h1", 13, label="env", owner="learner")


def test_refusal_is_none_for_a_node_that_fits() -> None:
    assert refusal(ENV, Where(label="env", host="h2", cpus=2, gpus=1, resources={"slots": 2}), "cuda:0", {}) is None
    assert refusal(PLAIN, Where(), None, {}) is None


def test_refusal_names_an_unavailable_node_by_its_reason() -> None:
    assert refusal(ENV, Where(), None, {2: LOST}) == "lost"
    assert refusal(ENV, Where(), None, {2: LEAVING}) == "leaving the system"


def test_refusal_names_the_owner_of_an_actors_own_process_whatever_is_asked() -> None:
    assert refusal(OWNED, Where(label="env"), None, {}) == "the own process of learner"


def test_refusal_names_the_label_the_node_has_and_the_one_asked() -> None:
    assert refusal(PLAIN, Where(label="env"), None, {}) == "label None, not 'env'"
    assert refusal(ENV, Where(label="learner"), None, {}) == "label 'env', not 'learner'"


def test_refusal_names_the_host_the_node_is_on_and_the_one_asked() -> None:
    assert refusal(PLAIN, Where(host="h2"), None, {}) == "on host 'h1', not 'h2'"


def test_refusal_names_the_device_the_node_lacks_and_those_it_has() -> None:
    assert refusal(PLAIN, Where(), "cuda:1", {}) == "has no cuda:1 (no GPU)"
    assert refusal(ENV, Where(), "cuda:1", {}) == "has no cuda:1 (cuda:0)"
    assert refusal(PLAIN, Where(), "cpu", {}) is None


def test_refusal_names_the_first_resource_the_node_has_too_little_of() -> None:
    assert refusal(PLAIN, Where(cpus=8), None, {}) == "has 4 cpus, needs 8 cpus"
    assert refusal(PLAIN, Where(gpus=1), None, {}) == "has 0 gpus, needs 1 gpus"
    assert refusal(ENV, Where(resources={"slots": 3}), None, {}) == "has 2 slots, needs 3 slots"
    assert refusal(PLAIN, Where(resources={"slots": 1}), None, {}) == "has 0 slots, needs 1 slots"


def test_refusal_checks_in_order_availability_owner_label_host_device_amounts() -> None:
    where = Where(label="learner", host="elsewhere", cpus=64)
    assert refusal(OWNED, where, "cuda:3", {3: LOST}) == "lost"
    assert refusal(OWNED, where, "cuda:3", {}) == "the own process of learner"
    assert refusal(ENV, where, "cuda:3", {}) == "label 'env', not 'learner'"
    assert refusal(ENV, Where(host="elsewhere", cpus=64), "cuda:3", {}) == "on host 'h2', not 'elsewhere'"
    assert refusal(ENV, Where(cpus=64), "cuda:3", {}) == "has no cuda:3 (cuda:0)"


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
