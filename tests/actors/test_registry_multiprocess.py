"""Names across real processes: a stopped actor's name is gone from every node that had it cached, under load.

``mp_scripts/names.py`` runs one four-node system that keeps every node busy
with calls, caches each round's name on every node, stops the actor (plain or
relocatable, from rank 0 or from another node) and looks the name up from
every node at once; its last round stops an actor while a node that cached
the name is kept busy by a handler for longer than the registry waits. It
first uses one actor's name every way a program does before stopping it.
"""

from __future__ import annotations

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

ROUNDS = 8
NODES = 4
GONE = ["ActorNotFoundError"] * NODES
"""What a brief lookup of the stopped actor's name gives on each node."""


@pytest.fixture(scope="module")
def names() -> Finished:
    return run_script("names.py", timeout=220)


@pytest.mark.timeout(240)
def test_a_stopped_actors_name_is_gone_at_once_from_every_node_that_cached_it(names: Finished) -> None:
    names.assert_clean_exit(0)
    assert names.returned() == {"rounds": ROUNDS, "loaded": True}
    for index in range(ROUNDS):
        r = names.result(f"round {index}")
        assert r["cached"] == [r["on"]] * NODES, f"round {index}: every node had the name cached: {r}"
        assert r["after"] == GONE, f"round {index}: the name was still resolvable after stop() returned: {r}"
        assert r["listed"] == [[]] * NODES, f"round {index}: lookup_all still listed it: {r}"
    stoppers = {names.result(f"round {index}")["stopper"].split(" on ")[0] for index in range(ROUNDS)}
    relocatable = {names.result(f"round {index}")["relocatable"] for index in range(ROUNDS)}
    assert (stoppers, relocatable) == ({"main", "finder"}, {False, True})


@pytest.mark.timeout(240)
def test_a_node_busy_past_the_eviction_wait_still_drops_the_name_before_it_looks_again(names: Finished) -> None:
    r = names.result("busy")
    assert r["cached"] == [1] * NODES
    assert r["after"] == GONE, f"node {r['busy']} still resolved the name once its handler was done: {r}"
    assert r["listed"] == [[]] * NODES


@pytest.mark.timeout(240)
def test_a_name_used_every_way_is_gone_from_every_node_once_stop_returns(names: Finished) -> None:
    r = names.result("used every way")
    assert r["cached"] == [1, 1]  # rank 0 and a node other than the actor's had it cached
    assert r["globbed"] == ["held/out"]
    assert r["refused"] == "NameTakenError"
    assert r["errors"] == ["RemoteError(TypeError)"] * 3
    assert r["counted"] == 1500  # the 500 tells, then the 1,000 calls
    assert r["after"] == GONE, f"the name was still resolvable after stop() returned: {r}"
    assert r["listed"] == [[]]
