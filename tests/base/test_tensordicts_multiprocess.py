"""TensorDicts as arguments and results of calls between processes, over real torch RPC.

All checks share one run of ``mp_scripts/tensordicts.py`` (see ``_mp``: it runs
in its own session, a hang fails the test and no process outlives it).
"""

from __future__ import annotations

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

FIRST_USE = 240  # pytest-timeout for tests that may start the shared run
LARGE = 1 << 20  # bytes of the script's large tensor


@pytest.fixture(scope="module")
def shared_run() -> Finished:
    """One run of ``tensordicts.py`` (3 processes) shared by the tests of this module."""
    pytest.importorskip("tensordict")
    return run_script("tensordicts.py", timeout=150.0)


@pytest.mark.timeout(FIRST_USE)
def test_tensordict_run_returns_and_leaves_no_process(shared_run: Finished) -> None:
    shared_run.assert_clean_exit(0)
    assert shared_run.returned() == {"main": "returned", "checks": 2}, shared_run.report()


@pytest.mark.timeout(FIRST_USE)
def test_tensordict_argument_arrives_on_another_node_as_sent(shared_run: Finished) -> None:
    r = shared_run.result("echo")
    assert r["arrived"] == r["sent"]
    assert r["arrived"]["batch_size"] == [2, 3]
    assert r["arrived"]["device"] == "cpu"
    assert r["arrived"]["locked"] is True
    assert r["arrived"]["nested"] == "TensorDict"
    assert r["arrived"]["env"] == "Pixels"


@pytest.mark.timeout(FIRST_USE)
def test_tensordict_argument_sends_its_tensors_on_the_tensor_path(shared_run: Finished) -> None:
    r = shared_run.result("echo")
    assert r["sent_tensor_bytes"] >= LARGE - 64
    assert r["sent_bytes"] < 4096, "the large tensor's bytes stayed out of the message"


@pytest.mark.timeout(FIRST_USE)
def test_tensordict_result_comes_back_from_another_node(shared_run: Finished) -> None:
    r = shared_run.result("echo")["returned"]
    assert r["type"] == "TensorDict"
    assert r["batch_size"] == [2, 3]
    assert r["device"] == "cpu"
    assert r["advantage"] == [[[1.0]] * 3] * 2
    assert r["large"] == 2.0 * r["large_elements"]
    assert shared_run.result("echo")["returned_bytes"] < 4096, "the returned tensor's bytes stayed out of the reply"


@pytest.mark.timeout(FIRST_USE)
def test_collectors_batch_as_a_tensordict_reaches_a_learner_on_another_node(shared_run: Finished) -> None:
    r = shared_run.result("collected")
    seen = r["seen"]
    assert seen["type"] == "TensorDict"
    assert seen["batch_size"] == [2, 8]
    assert seen["keys"] == [
        "action",
        "action_log_prob",
        "next/done",
        "next/observation",
        "next/reward",
        "next/terminated",
        "next/truncated",
        "observation",
    ]
    assert seen["observation"] == "torch.uint8"
    assert seen["frames"] == 16
    assert seen["observation_sum"] == r["observation_sum"]
