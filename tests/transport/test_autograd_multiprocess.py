"""Distributed autograd through actor calls over real torch RPC: every shape a pipeline takes keeps its gradients."""

from __future__ import annotations

import pytest
from _mp import Finished, run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(200)]

RPC_TIMEOUT = 10.0  # the script's


@pytest.fixture(scope="module")
def autograd() -> Finished:
    """One run of ``autograd.py`` (3 processes) shared by this module's tests."""
    return run_script("autograd.py", timeout=150.0)


def test_autograd_run_returns_and_leaves_no_process(autograd: Finished) -> None:
    autograd.assert_clean_exit(0)
    assert autograd.returned() == {"main": "returned", "checks": 10}, autograd.report()


@pytest.mark.parametrize(
    ("check", "stages"),
    [
        ("plain", 1),
        ("in_flight", 1),
        ("relayed", 2),
        ("waiting", 1),
        ("chained", 2),
        ("batched", 1),
        ("rrefs", 2),
    ],
)
def test_backward_through_actor_calls_reaches_every_remote_parameter(
    autograd: Finished, check: str, stages: int
) -> None:
    result = autograd.result(check)
    assert "failed" not in result, result
    assert len(result["norms"]) == stages
    for norms in result["norms"]:
        assert all(norm > 0 for norm in norms), result
    assert result["input_grad"], result


def test_plain_call_gradients_are_those_of_the_linear_layer(autograd: Finished) -> None:
    # loss = sum(W x + b) over 2 rows of ones: dW is 2 everywhere (16 entries), db is 2 (4 entries)
    assert autograd.result("plain")["norms"] == [[pytest.approx(8.0), pytest.approx(4.0)]]


def test_two_tasks_of_one_node_hold_two_contexts_at_once(autograd: Finished) -> None:
    result = autograd.result("two_contexts")
    assert "failed" not in result, result
    first, second = result["contexts"]
    assert first != second
    # the second task's input was twice the first's: its weight gradient is twice as large
    assert result["norms"] == [[pytest.approx(8.0), pytest.approx(4.0)], [pytest.approx(16.0), pytest.approx(4.0)]]


def test_a_second_raw_context_on_one_node_names_in_autograd_context(autograd: Finished) -> None:
    result = autograd.result("clash")
    assert isinstance(result["first"], int), result
    assert result["second_is_runtime_error"] is True
    printed = result["second_printed"]
    assert "actorch.RemoteError(RuntimeError): Already have an autograd context id for this thread" in printed
    assert "Two distributed autograd contexts were open at once on this node" in printed
    assert "`await actorch.in_autograd_context(step, ...)`" in printed


def test_backward_whose_gradients_go_to_a_killed_node_fails_within_the_rpc_timeout(autograd: Finished) -> None:
    result = autograd.result("lost_node")
    assert result["raised"] == "RuntimeError", result
    assert result["after"] < RPC_TIMEOUT + 5.0, result
