"""``ActorSystem.process_group``: torch.distributed groups beside actors, over torch RPC and refused in-process."""

from __future__ import annotations

from typing import Any

import pytest
from _mp import Finished, run_script

import actorch
from actorch.testing import LocalWorld

HINT = "at the same time"


def multiprocess(test: Any) -> Any:
    """Mark ``test`` as reading the multi-process run, with a time limit."""
    return pytest.mark.multiprocess(pytest.mark.timeout(120)(test))


@pytest.fixture(scope="module")
def groups() -> Finished:
    """One run of ``process_groups.py`` (3 processes, members on ranks 1 and 2) shared by the multi-process tests."""
    return run_script("process_groups.py", timeout=90.0)


@multiprocess
def test_process_group_run_ends_cleanly_after_a_member_was_killed(groups: Finished) -> None:
    groups.assert_clean_exit(0)
    assert groups.result("returned")["value"] == {"main": "returned", "checks": 5}, groups.report()
    # A group freed by a daemon thread while the interpreter exits aborts that worker; none may be.
    assert "terminate called" not in groups.stderr, groups.report()


@multiprocess
def test_process_group_all_reduce_across_actors_spawned_one_after_another(groups: Finished) -> None:
    result = groups.result("spawned_one_after_another")
    assert result["joined"] == [{"rank": 0, "size": 2, "ranks": [1, 2]}, {"rank": 1, "size": 2, "ranks": [1, 2]}]
    assert result["sums"] == [3.0, 3.0]
    assert result["broadcast"] == [2.0, 2.0]  # src is an actorch rank


@multiprocess
def test_process_group_ddp_steps_leave_identical_parameters_on_both_members(groups: Finished) -> None:
    first, second = groups.result("ddp")["results"]
    assert first["moved"]
    assert second["moved"]
    assert first["params"] == second["params"]


@multiprocess
def test_process_group_made_again_and_beside_a_group_over_every_node(groups: Finished) -> None:
    result = groups.result("again_and_beside")
    assert result["sums_again"] == [3.0, 3.0]
    assert result["world"]["rank"] == 0
    assert result["world"]["size"] == 3
    assert [joined["ranks"] for joined in result["world"]["joined"]] == [[0, 1, 2], [0, 1, 2]]
    assert result["world_sums"] == [13.0, 13.0, 13.0]  # 10 from main, 1 and 2 from the members


@multiprocess
def test_process_group_lone_member_times_out_naming_the_missing_node(groups: Finished) -> None:
    result = groups.result("lone_member")
    error = result["lone"]["error"]
    assert error["type"] == "TimeoutError"
    assert "node(s) [2] did not call process_group" in error["message"]
    assert HINT in error["message"]
    assert result["sums_after"] == [3.0, 3.0]  # the abandoned meeting misleads no later one


@multiprocess
def test_process_group_in_on_start_fails_within_lookup_timeout_with_the_hint(groups: Finished) -> None:
    error = groups.result("eager_members")["spawn"]["error"]
    assert "TimeoutError" in error["mro"]
    assert "RemoteError" in error["mro"]
    assert "node(s) [2] did not call process_group within 3 s" in error["message"]
    assert HINT in error["message"]


@multiprocess
def test_process_group_collective_fails_at_once_when_a_member_is_killed(groups: Finished) -> None:
    outcome = groups.result("member_killed")["outcome"]
    assert "error" in outcome, outcome
    assert "Connection closed by peer" in outcome["error"]["message"]


async def test_process_group_in_process_world_raises_unsupported(world: LocalWorld) -> None:
    with pytest.raises(actorch.UnsupportedError, match=r"needs a system on torch RPC"):
        await world[1].process_group([1, 2])


@pytest.mark.parametrize(
    ("ranks", "match"),
    [([0, 2], "not a member"), ([1, 1], "appears twice"), ([1, 7], r"\[7\] are not ranks"), ([True], "ints")],
)
async def test_process_group_bad_ranks_raise_value_error(world: LocalWorld, ranks: list[Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        await world[1].process_group(ranks)


async def test_process_group_other_backend_raises_unsupported(world: LocalWorld) -> None:
    with pytest.raises(actorch.UnsupportedError, match=r"backend='nccl'"):
        await world[1].process_group([1, 2], backend="nccl")


async def test_process_group_with_a_lost_member_raises_node_lost(world: LocalWorld) -> None:
    world.kill(2)
    with pytest.raises(actorch.NodeLostError, match="node 2 was lost"):
        await world[1].process_group([1, 2])
