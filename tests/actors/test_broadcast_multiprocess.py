"""Broadcast over real torch RPC: rank 0 and two spawned workers, several members on each.

One run of ``mp_scripts/broadcast_world.py`` (see ``_mp``: it runs in its own
session, a hang fails the test and no process outlives it).
"""

from __future__ import annotations

import pytest
from _mp import run_script

pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(240)
def test_broadcast_between_processes_sends_one_copy_per_node_and_keeps_each_members_outcome() -> None:
    run = run_script("broadcast_world.py", timeout=150.0)
    run.assert_clean_exit(0)
    assert run.returned() == {"main": "returned", "checks": 1}, run.report()
    r = run.result("broadcast")
    mb = float(r["nbytes"] // 4)
    assert r["digests"] == [[0, 0, mb], [1, 1, mb], [2, 1, mb], [3, 1, mb], [4, 2, mb], [5, 2, mb], [6, 2, mb]]
    assert r["tensor_bytes"] == {"1": r["nbytes"], "2": r["nbytes"]}, "one copy per node, not one per member"
    failed = r["outcomes"][4]
    assert {"RemoteError", "ValueError"} <= set(failed["mro"])
    assert failed["message"] == "receiver 4 refuses"
    assert [outcome for index, outcome in enumerate(r["outcomes"]) if index != 4] == [0, 1, 2, 3, 5, 6]
    assert r["recorded"] == [["told", "after"]] * 7
