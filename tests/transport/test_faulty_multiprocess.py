"""``FaultyTransport`` in a world of processes: its record travels to every node; a partition shows as a real one."""

from __future__ import annotations

import pytest
from _mp import Finished, Script, script_argv

pytestmark = pytest.mark.multiprocess

TIMEOUT = 120.0


@pytest.fixture(scope="module")
def partitioned() -> Finished:
    return Script(script_argv("faulty_world.py")).finish(timeout=TIMEOUT)


@pytest.fixture(scope="module")
def stalled() -> Finished:
    """The same world, with rank 0 stopped for a second just after the cut: rank 2 counts it lost a second earlier."""
    return Script(script_argv("faulty_world.py", "stalled")).finish(timeout=TIMEOUT)


def test_a_partition_of_a_run_world_loses_the_cut_node_and_fails_the_call_waiting_on_it(partitioned: Finished) -> None:
    partitioned.assert_clean_exit()
    assert partitioned.leftovers == []
    assert partitioned.returned() == "returned"
    result = partitioned.result("partition")
    assert result["outcome"]["error"]["type"] == "NodeLostError"
    assert result["why"].startswith("not heard from for")
    assert result["lane_bundles_before"] > 0  # the lane carried until the cut, and was cut with the rest


def test_a_partition_cuts_the_node_off_from_every_other_and_leaves_the_rest_talking(partitioned: Finished) -> None:
    result = partitioned.result("partition")
    assert result["near_lost"] == [2]
    assert result["near_still_answers"] is True
    for node, peers in ((0, [2]), (1, [2]), (2, [0, 1])):  # every node ran the schedule it was given
        # in the text, not line by line: nodes log the cut at the same moment, and their lines may run together
        assert f'"node": {node}, "peers": {peers}, "event": "partition: links cut"' in partitioned.stderr


def test_a_cut_off_node_of_this_machine_is_judged_by_its_silence_not_spared_for_running(partitioned: Finished) -> None:
    assert partitioned.logs("node silent, but its process runs: suspected, not lost") == []


def test_a_cut_off_node_that_counts_rank_0_lost_first_cannot_tell_it_so_across_the_cut(stalled: Finished) -> None:
    # Rank 2 hears nothing from rank 0 from the cut on and counts it lost a liveness timeout later; rank 0, stopped
    # meanwhile, gives rank 2 its full timeout from when it runs again. Rank 2's word (an expel on the lane, the answer
    # to rank 0's watch) would reach rank 0 first if it crossed the cut; a real partition carries nothing.
    stalled.assert_clean_exit()
    assert stalled.leftovers == []
    result = stalled.result("partition")
    assert result["outcome"]["error"]["type"] == "NodeLostError"
    assert result["why"].startswith("not heard from for"), result["why"]
    assert result["near_lost"] == [2]
