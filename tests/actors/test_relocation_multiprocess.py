"""Relocation between real processes: one run of ``mp_scripts/relocate.py`` (3 processes), shared by these tests.

Node 2, hosting a named ``ReplayBuffer`` that saves every 10 additions, is
killed with SIGKILL after 57 additions; then node 1, where the buffer moved,
is frozen with SIGSTOP past the liveness timeout, leaving no node to move to.
"""

from __future__ import annotations

from typing import Any

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

RUN_TIMEOUT = 90


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    return run_script("relocate.py", str(tmp_path_factory.mktemp("relocate")), timeout=RUN_TIMEOUT)


def raised(outcome: dict[str, Any], kind: str) -> str:
    """The message of what ``outcome`` raised, once it is checked to be a ``kind``."""
    assert "error" in outcome, f"expected {kind}, got {outcome}"
    assert kind in outcome["error"]["mro"], outcome["error"]
    message: str = outcome["error"]["message"]
    return message


@pytest.mark.timeout(RUN_TIMEOUT + 10)
def test_relocation_run_ends_cleanly_with_its_stopped_node_killed(run: Finished) -> None:
    run.assert_clean_exit(0)
    assert run.result("ended") == {"check": "ended", "result": "main finished", "stopped_dead": [True]}


@pytest.mark.timeout(RUN_TIMEOUT + 10)
def test_killed_replay_buffer_resumes_on_another_node_losing_exactly_what_followed_its_last_save(
    run: Finished,
) -> None:
    moved = run.result("moved")
    assert moved["before"]["size"] == 57
    assert moved["before"]["saved"] == 5, "57 additions, a save every 10: the last one held 50"
    assert moved["old_ref"]["value"]["size"] == 50, "the 7 additions after the last save are lost, only they"
    assert moved["sampled"] == list(range(50)), "4000 draws see every transition kept, and none other"
    assert moved["first_after_kill"] is not None, "sampling by name went on after the kill"


@pytest.mark.timeout(RUN_TIMEOUT + 10)
def test_a_call_in_flight_fails_with_node_lost_and_later_calls_through_old_refs_succeed(run: Finished) -> None:
    moved = run.result("moved")
    assert "node 2 was lost while calling 'hang'" in raised(moved["in_flight"], "NodeLostError")
    assert moved["old_ref_rank"] == 1, "main's own ref followed the buffer to node 1"
    assert moved["held"]["value"] == 50, "a ref held by an actor on node 1 reaches it too"
    assert moved["tally_where"]["value"][0] == 1
    assert moved["tally_after"]["value"] == 0, "a relocatable actor that never saved starts fresh"
    assert set(moved["sample_errors"]) <= {"NodeLostError"}, "sampling only ever saw the loss itself"


@pytest.mark.timeout(RUN_TIMEOUT + 10)
def test_an_actor_placed_apart_from_others_is_not_moved_to_their_nodes(run: Finished) -> None:
    moved = run.result("moved")
    assert moved["apart_where"] == 2, "node 2 alone was apart from both"
    message = raised(moved["apart_after"], "NodeLostError")
    assert "node 2 was lost, and the actor could not be relocated: no node can host it (node 0: rank 0 hosts" in message
    assert "; node 1: the node of <ActorRef actor Holder#" in message
    assert message.endswith("on node 1>; node 2: lost)")


@pytest.mark.timeout(RUN_TIMEOUT + 10)
def test_lookups_find_the_relocated_buffer_and_not_a_plain_actor(run: Finished) -> None:
    moved = run.result("moved")
    assert moved["found"] == [1, True], "the name leads to node 1, to an actor equal to the old ref's"
    raised(moved["plain_call"], "NodeLostError")
    raised(moved["plain_lookup"], "ActorNotFoundError")


@pytest.mark.timeout(RUN_TIMEOUT + 10)
def test_a_frozen_node_with_no_node_left_to_move_to_strands_the_buffer_with_a_clear_error(run: Finished) -> None:
    stranded = run.result("stranded")
    message = raised(stranded["call"], "NodeLostError")
    assert "node 1 was lost, and the actor could not be relocated: no node can host it" in message
    assert "node 0: rank 0 hosts no relocatable actor" in message
    raised(stranded["lookup"], "ActorNotFoundError")
    assert stranded["exit"]["value"].startswith("ActorExit(reason='node_lost'")
    assert stranded["listed"] == [], "the names of lost actors are gone"
    assert "rank 0 runs main" in raised(stranded["refused"], "ValueError")
