"""One conformance suite over every kind of transport: what ``Transport`` promises, checked of each kind alike.

As pykka runs its tests over each of its runtimes, one fixture runs one world
per kind (``mp_scripts/conformance.py``: rank 0 drives, ranks 1 to 3 answer,
in this process's loop for an in-process kind, in processes of their own
otherwise), and every test below reads what that world saw. A new kind is
correct when it passes them: add it to ``KINDS`` there and to ``WORLDS`` here.
The promises are listed in ``actorch/_transport/base.py``'s docstring.
"""

from __future__ import annotations

import pytest
from _mp import Finished, Script, script_argv

MP = pytest.mark.multiprocess
WORLDS = [
    pytest.param("in_process", id="in_process"),
    pytest.param("torch_rpc", id="torch_rpc", marks=MP),
    pytest.param("torch_rpc_lane", id="torch_rpc_lane", marks=MP),
    pytest.param("faulty_in_process", id="faulty_in_process"),
    pytest.param("faulty_torch_rpc_lane", id="faulty_torch_rpc_lane", marks=MP),
]
"""Every kind under test, by the name the script knows its options record by (faults off for the faulty ones)."""

REMOTE = {"torch_rpc", "torch_rpc_lane", "faulty_torch_rpc_lane"}
"""Kinds whose peers run in processes of their own: their peers can stop taking while rank 0 sends."""
LANE = {"torch_rpc_lane", "faulty_torch_rpc_lane"}
MESSAGES = 300
BLOCKED_BYTES = 8 << 20
"""What rank 0 sends a blocked peer on the main path: eight tensors of a MiB."""
LOSS_BOUND = 2.5
"""Seconds within which a killed peer is reported (a killed process: at once; the liveness timeout at most)."""
TIMEOUT = 150.0


@pytest.fixture(scope="module", params=WORLDS)
def world(request: pytest.FixtureRequest) -> Finished:
    finished = Script(script_argv("conformance.py", request.param)).finish(timeout=TIMEOUT)
    finished.kind = request.param  # type: ignore[attr-defined]
    return finished


def kind_of(world: Finished) -> str:
    kind: str = world.kind  # type: ignore[attr-defined]
    return kind


def test_the_world_runs_every_case_and_ends_cleanly_leaving_no_process(world: Finished) -> None:
    world.assert_clean_exit()
    assert world.leftovers == []
    assert world.result("suite")["seconds"] > 0
    layers, kind = world.result("world")["layers"], kind_of(world)
    assert (layers[0] == "FaultInjection") == kind.startswith("faulty")
    assert ("LaneTransport" in layers) == (kind in LANE)


def test_bundles_of_one_link_arrive_in_send_order_both_ways_whichever_path_each_took(world: Finished) -> None:
    order = world.result("order")
    assert order["out"] == list(range(MESSAGES))
    assert order["back"] == list(range(MESSAGES))
    if kind_of(world) in LANE:
        assert {"lane", "torch_rpc"} <= set(order["paths"])  # both paths were taken, and put back in order


def test_replies_put_on_a_received_bundles_port_come_back_each_once(world: Finished) -> None:
    echoed = world.result("replies")["echoed"]
    assert echoed == [[number, [float(number)] * 3] for number in range(20)]


def test_tensors_arrive_bitwise_as_they_were_sent(world: Finished) -> None:
    tensors = world.result("tensors")
    assert tensors["came"] == tensors["sent"]
    assert tensors["different"] == []


def test_backlog_counts_what_a_peer_has_not_taken_until_it_takes_it(world: Finished) -> None:
    backlog = world.result("backlog")
    assert backlog["queued"] >= 3 * 1000  # queued for this iteration's bundle counts at once
    assert backlog["drained"] == 0
    if kind_of(world) in REMOTE:
        assert (
            backlog["blocked"] >= BLOCKED_BYTES
        )  # a peer that takes nothing: all of it waits (the send budget reads this)


def test_what_a_stranger_sends_is_never_taken_as_a_peers(world: Finished) -> None:
    strangers = world.result("strangers")
    assert strangers["knows_stranger"] is False
    assert strangers["taken_as_known"] == 0
    if kind_of(world) in REMOTE:
        assert strangers["impersonated"] == "actorch:expelled"  # a rank the world never met is told so
    if kind_of(world) in LANE:
        assert strangers["refused_lane"] >= 1  # a connection that proves nothing is refused


def test_a_forgotten_peer_is_neither_known_nor_listed_nor_ever_reported_lost(world: Finished) -> None:
    forgotten = world.result("forgotten")
    assert forgotten == {**forgotten, "knows": False, "listed": False, "taken_as_known": 0, "reported_lost": []}


def test_a_killed_peer_is_reported_lost_once_with_a_reason_and_later_sends_fail_nothing(world: Finished) -> None:
    loss = world.result("loss")
    assert len(loss["reports"]) == 1
    assert loss["reports"][0]
    assert loss["reported_after"] < LOSS_BOUND
    assert loss["others_lost"] == [2]
