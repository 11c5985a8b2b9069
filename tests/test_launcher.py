"""``actorch.run`` options checked before anything starts, and the transport's liveness settings."""

from __future__ import annotations

from typing import Any

import pytest

import actorch
from actorch._rpc_transport import RpcOptions


async def answer(system: actorch.ActorSystem) -> int:
    return system.world_size * 42


def test_run_in_one_process_returns_what_main_returned() -> None:
    assert actorch.run(answer, configure_logs=False) == 42


@pytest.mark.parametrize("timeout", [0, -1.0, True, "3"])
def test_run_refuses_a_liveness_timeout_that_is_not_a_positive_number(timeout: Any) -> None:
    with pytest.raises(ValueError, match="liveness_timeout must be a positive number"):
        actorch.run(answer, liveness_timeout=timeout, configure_logs=False)


def test_rpc_options_heartbeat_must_fit_twice_in_the_liveness_timeout() -> None:
    assert RpcOptions(heartbeat_interval=1.0, liveness_timeout=2.0).liveness_timeout == 2.0
    with pytest.raises(ValueError, match="heartbeat_interval must be > 0 and at most half"):
        RpcOptions(heartbeat_interval=1.5, liveness_timeout=2.0)
    with pytest.raises(ValueError, match="heartbeat_interval must be > 0"):
        RpcOptions(heartbeat_interval=0.0)
