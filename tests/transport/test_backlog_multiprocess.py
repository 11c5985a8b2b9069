"""The send budget: what one node queues toward a frozen node stays bounded, on the fast lane and on torch RPC."""

from __future__ import annotations

from typing import Any

import pytest
from _mp import run_script

pytestmark = pytest.mark.multiprocess

MIB = 1 << 20
SEND_BUDGET = 32 * MIB
"""What the script gives ``run(send_budget=...)``."""
KERNEL_SLACK = 16 * MIB
"""What the kernel's socket buffers take beyond the budget, on the lane (the process no longer holds it)."""


@pytest.fixture(scope="module")
def frozen() -> dict[str, Any]:
    run = run_script("frozen_budget.py", timeout=90)
    run.assert_clean_exit()
    return run.result("frozen_budget")


@pytest.mark.parametrize("path", ["lane", "rpc"])
def test_tells_to_a_frozen_node_stop_at_the_send_budget_with_mailbox_full(frozen: dict[str, Any], path: str) -> None:
    got = frozen[path]
    assert SEND_BUDGET // MIB <= got["accepted"] <= (SEND_BUDGET + KERNEL_SLACK) // MIB, got
    assert "toward node 1 have not reached it (send_budget 33,554,432; the node may be frozen" in got["refused"]
    assert got["refused"].startswith("cannot tell 'echo' to actor 'frozen/c' (Counter) on node 1: ")


@pytest.mark.parametrize("path", ["lane", "rpc"])
def test_a_frozen_node_costs_its_caller_about_the_send_budget_in_memory(frozen: dict[str, Any], path: str) -> None:
    assert frozen[path]["grown"] < SEND_BUDGET + 64 * MIB, frozen[path]


@pytest.mark.parametrize("path", ["lane", "rpc"])
def test_a_call_over_the_send_budget_waits_and_goes_once_the_node_runs_again(frozen: dict[str, Any], path: str) -> None:
    got = frozen[path]
    assert got["call"]["error"]["type"] == "TimeoutError"  # it waited for the backlog, within its deadline
    assert got["after_resume"]["value"] == 0
    assert frozen["lost"] == {}
