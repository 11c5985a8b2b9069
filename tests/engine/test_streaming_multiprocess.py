"""Streams between real processes over torch RPC: one run of ``streams.py`` (three processes) for every test."""

from __future__ import annotations

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

LIVENESS = 2.5  # run()'s default liveness_timeout


@pytest.fixture(scope="module")
def streams() -> Finished:
    return run_script("streams.py", timeout=120.0)


@pytest.mark.timeout(150)
def test_the_run_ends_cleanly_with_two_nodes_killed(streams: Finished) -> None:
    streams.assert_clean_exit(0)
    assert streams.returned() == {"main": "returned", "checks": 5}, streams.report()


@pytest.mark.timeout(150)
def test_items_cross_processes_in_order_and_once_each(streams: Finished) -> None:
    result = streams.result("in_order")
    assert result["ordered"] is True, result
    assert result["count"] == 2000


@pytest.mark.timeout(150)
def test_a_tensor_the_producer_reuses_arrives_as_it_was_yielded(streams: Finished) -> None:
    result = streams.result("tensors")
    assert result["values"] == list(range(20)), result
    assert result["sizes"] == [1 << 18]


@pytest.mark.timeout(150)
def test_break_closes_the_producer_in_its_process(streams: Finished) -> None:
    result = streams.result("early_break")
    assert "failed" not in result, result


@pytest.mark.timeout(150)
def test_the_consumers_node_dying_closes_the_producer(streams: Finished) -> None:
    result = streams.result("consumer_lost")
    assert "failed" not in result, result
    assert result["closed_after"] < LIVENESS + 3.0, result


@pytest.mark.timeout(150)
def test_the_producers_node_dying_raises_node_lost_in_the_loop(streams: Finished) -> None:
    result = streams.result("producer_lost")
    assert result["raised"] == "NodeLostError", result
    assert result["received"] >= 5
    assert "node 1 was lost while streaming 'count'" in result["why"]
    assert result["after"] < LIVENESS + 3.0, result
