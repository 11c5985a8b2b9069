"""Real multi-process runs: rank 0 plus spawned workers (or torchrun's) talking torch RPC over 127.0.0.1.

Each run is a script of ``tests/mp_scripts`` started in its own session (see
``_mp``), so a hang fails the test and no process outlives it. Most checks share
one three-process run of ``basics.py`` (a torch import costs seconds per
process); the launch, failure and shutdown paths get runs of their own.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _mp import CPP_WARNING, Finished, Script, run_argv, run_script, script_argv, torchrun_argv, wait_for_file

pytestmark = pytest.mark.multiprocess

BASICS_TIMEOUT = 150.0
FIRST_USE = 240  # pytest-timeout for tests that may run the shared basics script


@pytest.fixture(scope="module")
def basics_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("basics")


@pytest.fixture(scope="module")
def basics(basics_dir: Path) -> Finished:
    """One run of ``basics.py`` (3 processes) shared by the tests of this module."""
    return run_script("basics.py", str(basics_dir), timeout=BASICS_TIMEOUT)


def error_of(outcome: dict[str, Any]) -> dict[str, Any]:
    assert "error" in outcome, f"expected an exception, got {outcome}"
    return outcome["error"]


def assert_raised(outcome: dict[str, Any], *classes: str) -> dict[str, Any]:
    """``outcome`` (from ``attempt``) raised an exception that is an instance of every named class."""
    error = error_of(outcome)
    missing = [name for name in classes if name not in error["mro"]]
    assert not missing, f"expected {classes}, got {error['type']} (mro {error['mro']}): {error['message']}"
    return error


# --------------------------------------------------------------------------- the shared run


@pytest.mark.timeout(FIRST_USE)
def test_normal_run_returns_mains_result_and_leaves_no_process(basics: Finished) -> None:
    basics.assert_clean_exit(0)
    assert basics.returned() == {"main": "returned", "checks": 17}, basics.report()


def assert_no_torch_noise(run: Finished) -> None:
    assert run.returncode == 0, run.report()
    assert not CPP_WARNING.search(run.stderr), f"C++ '[W' warning lines on stderr{run.report()}"
    assert "ProcessGroup" not in run.stderr, f"Gloo ProcessGroup deprecation warning on stderr{run.report()}"


@pytest.mark.timeout(FIRST_USE)
def test_call_typed_and_by_name_and_tells_are_applied_in_order(basics: Finished) -> None:
    r = basics.result("call_tell")
    assert (r["typed"], r["by_name"], r["keyword"], r["default"]) == (15, 20, 22, 23)
    assert r["after_tell"] == 123, "a tell must be applied before a later call from the same caller"
    assert r["told"] == list(range(50))


@pytest.mark.timeout(FIRST_USE)
def test_spawn_on_ranks_runs_in_those_processes(basics: Finished) -> None:
    r = basics.result("spawn_where")
    assert r["rank"] == 0
    assert r["world_size"] == 3
    assert r["refs"] == [["where/zero", 0], ["where/one", 1], ["where/two", 2]]
    node_pids = [pid for _, pid in r["nodes"]]
    assert [rank for rank, _ in r["nodes"]] == [0, 1, 2]
    assert node_pids[0] == r["main_pid"]
    assert len(set(node_pids)) == 3, "every rank is its own process"
    assert r["where"] == [[0, node_pids[0]], [1, node_pids[1]], [2, node_pids[2]]]


@pytest.mark.timeout(FIRST_USE)
def test_lookup_from_rank0_and_from_actor_on_other_rank(basics: Finished) -> None:
    r = basics.result("lookup")
    assert r["same"] is True
    assert r["found"] == ["lookup/target", 1, 7]
    assert r["from_actor"] == ["lookup/target", 1, 7]


@pytest.mark.timeout(FIRST_USE)
def test_lookup_waits_for_a_name_spawned_later(basics: Finished) -> None:
    r = basics.result("lookup_wait")
    assert r["early_done"] == [False, False], "lookups of a missing name must wait, not fail"
    assert r["from_main"] == ["late/x", 1, True]
    assert r["from_actor"] == ["late/x", 1, 3]


@pytest.mark.timeout(FIRST_USE)
def test_lookup_all_globs(basics: Finished) -> None:
    r = basics.result("lookup_all")
    assert r["star"] == ["pool/w1", "pool/w2", "pool/x10"]
    assert r["star_ranks"] == [1, 2, 2]
    assert r["star_values"] == [0, 1, 4]
    assert r["double_star"] == ["pool/sub/w3", "pool/w1", "pool/w2", "pool/x10"]
    assert r["question"] == ["pool/w1", "pool/w2"]
    assert r["nothing"] == []


@pytest.mark.timeout(FIRST_USE)
def test_name_taken_and_invalid_names(basics: Finished) -> None:
    r = basics.result("names")
    for key, on in (("taken_other", 2), ("taken_same", 1), ("taken_local", 0)):
        error = assert_raised(r[key], "NameTakenError", "ActorchError")
        assert error["type"] == "NameTakenError", error  # the registry's refusal, not an actor's RemoteError
        assert error["message"] == (
            f"name 'taken/a' is taken by <ActorRef actor 'taken/a' (Counter) on node 1>; spawn on node {on} refused"
        )
    assert r["original_value"] == 1, "a refused spawn must not disturb the name's holder"
    assert r["lookup_same"] is True
    assert r["listed"] == ["taken/a"]
    assert len(r["invalid"]) == 8
    for name, outcome in r["invalid"].items():
        assert "InvalidNameError" in error_of(outcome)["mro"], f"spawn(name={name!r}) gave {outcome}"
        assert "ValueError" in error_of(outcome)["mro"]
    assert_raised(r["lookup_invalid"], "InvalidNameError")
    assert_raised(r["pattern_invalid"], "InvalidNameError")
    assert "on_start refused" in assert_raised(r["bad_start"], "RemoteError", "ValueError")["message"]
    assert r["reused"] == [2, 9], "the name of a failed spawn must be free again"


@pytest.mark.timeout(FIRST_USE)
def test_stopped_actors_name_disappears_on_every_rank(basics: Finished) -> None:
    r = basics.result("stop_name")
    assert r["before_actor"] == ["temp/s", 2, 5]
    for key in ("after_main", "after_actor"):
        assert_raised(r[key], "ActorNotFoundError", "LookupError")
        assert r[key]["seconds"] < 3.0, f"{key}: lookup must give up at the caller's deadline"
    assert_raised(r["call_after"], "ActorStoppedError")
    assert_raised(r["call_via_lookup_ref"], "ActorStoppedError")
    assert "error" not in r["stop_again"], "stopping a stopped actor does nothing"
    assert r["listed"] == []
    assert r["respawned"] == [True, 1, 6]
    assert r["from_actor_again"] == ["temp/s", 1, 6], "a stale cache entry on rank 1 must not survive the stop"


@pytest.mark.timeout(FIRST_USE)
def test_per_caller_fifo_of_500_tells_and_calls(basics: Finished) -> None:
    r = basics.result("fifo")
    assert r["total"] == 1000
    assert r["calls"] == [167, 167]
    assert r["main"] == list(range(500)), "messages from rank 0 started out of order"
    assert r["actor"] == list(range(500)), "messages from the actor on rank 2 started out of order"


@pytest.mark.timeout(FIRST_USE)
def test_one_message_at_a_time_by_default_and_max_concurrency(basics: Finished) -> None:
    r = basics.result("concurrency")
    assert r["serial_peak"] == 1
    assert r["serial_seconds"] >= 1.1, "4 x 0.3 s handlers of a serial actor cannot overlap"
    assert r["wide_peak"] == 3


@pytest.mark.timeout(FIRST_USE)
def test_reentrant_chains_across_ranks(basics: Finished) -> None:
    r = basics.result("reentrancy")
    assert r["sequential"] == [1, 11, 21]
    assert r["concurrent"] == [value * 10 + 1 for value in range(8)]
    assert r["sequential_seconds"] < 5.0
    assert r["concurrent_seconds"] < 5.0


@pytest.mark.timeout(FIRST_USE)
def test_deadline_raises_timeout_and_cancels_remote_handler(basics: Finished) -> None:
    r = basics.result("deadline")
    assert_raised(r["timed_out"], "TimeoutError")
    assert r["timed_out"]["seconds"] < 2.0
    assert r["history_1"] == ["started d1", "cancelled d1"], "the remote handler must be cancelled"
    assert r["history_1_seconds"] < 2.0
    assert_raised(r["failed_after"], "TimeoutError")
    assert r["failed_after"]["seconds"] < 2.0
    assert r["history_2"] == ["started d1", "cancelled d1", "started d2", "cancelled d2"]
    assert r["in_time"]["value"] == "d3"


@pytest.mark.timeout(FIRST_USE)
def test_cancelling_the_caller_cancels_remote_handler(basics: Finished) -> None:
    r = basics.result("cancel")
    assert r["outcome"] == "cancelled"
    assert r["history"] == ["started c1", "cancelled c1"]
    assert r["history_seconds"] < 2.0


@pytest.mark.timeout(FIRST_USE)
def test_remote_errors_keep_type_exact_message_and_traceback(basics: Finished) -> None:
    r = basics.result("remote_errors")
    value_error = r["value_error"]
    assert "wrong" not in value_error, f"did not arrive as ValueError: {value_error}"
    assert value_error["is_remote_error"] is True
    assert value_error["is_actorch_error"] is True
    assert value_error["message"] == r["sent_message"], "non-ASCII message must arrive exactly"
    assert value_error["type_name"] == "ValueError"
    remote_traceback = value_error["remote_traceback"]
    assert "Traceback (most recent call last)" in remote_traceback
    assert "in explode" in remote_traceback
    assert "actors.py" in remote_traceback
    assert r["sent_message"].splitlines()[0] in remote_traceback
    custom = r["custom"]
    assert "wrong" not in custom, f"did not arrive as actors.CustomError: {custom}"
    assert custom == {"is_remote_error": True, "message": "custom \u00fc", "type_name": "actors.CustomError"}
    local_only = assert_raised(r["local_only"], "RemoteError")
    assert local_only["message"] == "defined inside a function"
    assert r["local_only_type_name"].endswith("LocalOnlyError")
    assert r["bad_start"] == {"is_remote_error": True, "message": "on_start refused"}
    assert r["still_serving"] == 3


@pytest.mark.timeout(FIRST_USE)
def test_endpoint_errors_and_actor_keeps_serving(basics: Finished) -> None:
    r = basics.result("endpoint_errors")
    for key in ("unknown", "private", "too_many", "bad_keyword", "tell_unknown", "tell_private", "tell_bad_args"):
        error = assert_raised(r[key], "EndpointError", "TypeError")
        assert "RemoteError" not in error["mro"], f"{key}: a bad call is not a handler error"
    assert "nope" in r["unknown"]["error"]["message"]
    assert "_private" in r["private"]["error"]["message"]
    assert_raised(r["handler_type_error"], "RemoteError", "TypeError")
    assert r["still_serving"] == 5


@pytest.mark.timeout(FIRST_USE)
def test_calls_to_stopped_actor(basics: Finished) -> None:
    r = basics.result("stopped")
    assert_raised(r["call"], "ActorStoppedError", "ActorchError")
    assert_raised(r["stopper_call"], "ActorStoppedError")
    assert "error" not in r["tell"], "a tell to a stopped actor is logged, not raised"
    assert r["on_stop_ran_before_stop_returned"] is True


@pytest.mark.timeout(FIRST_USE)
def test_tensors_round_trip_and_told_tensors_are_copied(basics: Finished) -> None:
    r = basics.result("tensors")
    assert r["big_equal"] is True, "64 MB tensor changed on its round trip"
    assert r["big_meta"] == ["torch.float32", [16 * 1024 * 1024], True]
    assert r["nested_types"] == ["dict", "tuple"]
    assert r["nested_equal"] is True
    assert r["view_equal"] is True
    assert r["told_sums"] == [0.0] * 5, "a tensor mutated right after tell() arrived mutated"


@pytest.mark.timeout(FIRST_USE)
def test_fast_lane_and_torch_rpc_messages_keep_their_order(basics: Finished) -> None:
    lanes = basics.result("lanes")
    assert lanes["order"] == list(range(300))
    assert lanes["lane_bundles"] > 0, "small messages went on the fast lane"
    assert lanes["tensor_bytes"] >= 43 * 65536, "the 64 KiB tensors went through torch RPC"
    assert lanes["remote_lane_bundles"] > 0, "replies came back on the fast lane"


@pytest.mark.timeout(FIRST_USE)
def test_on_stop_runs_on_every_rank_at_shutdown(basics: Finished, basics_dir: Path) -> None:
    assert basics.returncode == 0, basics.report()
    for rank in range(3):
        path = basics_dir / f"on_stop_rank{rank}"
        assert path.exists(), f"on_stop of the actor on rank {rank} did not run{basics.report()}"
        assert path.read_text().startswith(f"stopped on node {rank} ")


# --------------------------------------------------------------------------- launch paths


@pytest.mark.timeout(60)
def test_world_size_one_runs_in_one_process() -> None:
    run = run_script("simple.py", "--world-size", "1", timeout=45)
    run.assert_clean_exit(0)
    r = run.result("simple")
    assert (r["rank"], r["world_size"]) == (0, 1)
    assert r["host"] == [0, 0, r["main_pid"]]
    assert (r["typed"], r["by_name"], r["after_tell"]) == (3, 6, 10)
    assert r["lookup_same"] is True
    assert r["listed"] == ["simple/c"]
    assert r["tensor_equal"] is True
    assert run.returned() == {"answer": 42, "rank": 0}


@pytest.mark.timeout(90)
def test_strict_mode_refuses_values_that_need_pickle() -> None:
    run = run_script("simple.py", "--world-size", "2", "--strict", timeout=75)
    run.assert_clean_exit(0)
    r = run.result("simple")
    assert r["host"][:2] == [1, 1]
    assert r["host"][2] != r["main_pid"]
    s = run.result("serialization")
    assert s["strict"] is True
    assert "set" in assert_raised(s["set_call"], "SerializationError", "ActorchError", "TypeError")["message"]
    assert_raised(s["set_tell"], "SerializationError")
    assert_raised(s["set_result"], "SerializationError")
    assert s["plain_equal"] is True
    assert s["ref_equal"] is True
    assert s["still_serving"] == 10
    assert run.returned() == {"answer": 42, "rank": 0}
    assert_no_torch_noise(run)  # simple.py imports actorch before torch


@pytest.mark.timeout(120)
def test_torchrun_launch() -> None:
    """The script says ``world_size=3``: torchrun's two processes are the system, as under ``actorch run``."""
    run = run_argv(torchrun_argv("simple.py", "--world-size", "3", nproc=2), timeout=100)
    run.assert_clean_exit(0)
    r = run.result("simple")
    assert (r["rank"], r["world_size"]) == (0, 2)
    ignored = "run(world_size=3) is ignored: torchrun started 2 processes, and the launcher's count is the system's"
    assert run.stderr.count(ignored) == 1, f"rank 0 says so, once{run.report()}"
    assert r["host"][:2] == [1, 1]
    assert len(set(r["node_pids"])) == 2
    assert (r["typed"], r["by_name"], r["after_tell"]) == (3, 6, 10)
    assert r["lookup_same"] is True
    assert r["tensor_equal"] is True
    s = run.result("serialization")
    assert s["set_call"]["value"] == ["set", [1, 2, 3]], "without strict, a set travels by pickle"
    assert s["set_result"]["value"] == ["set", [1, 2, 3]]
    assert run.returned() == {"answer": 42, "rank": 0}
    assert run.stdout.count("RETURNED ") == 1, "only rank 0 runs main"


# --------------------------------------------------------------------------- failure and shutdown


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "how", ["handler", "pid", "stop"], ids=["killed-in-handler", "killed-by-pid", "stopped-by-sigstop"]
)
def test_node_lost_and_shutdown_with_a_dead_worker(how: str, tmp_path: Path) -> None:
    run = run_script("node_lost.py", how, str(tmp_path), timeout=75)
    run.assert_clean_exit(0)
    r = run.result("node_lost")
    assert r["reported_pid"] == r["victim_pid"]
    assert r["victim_dead"] is True  # killed, or stopped and then killed by rank 0 once lost
    pending = assert_raised(r["pending"], "NodeLostError", "ActorchError")
    if how == "stop":  # only the heartbeats can tell: default liveness timeout 2.5 s, pings every 0.5 s
        assert 1.5 < r["pending"]["since_kill"] < 3.5, f"a stopped node must be lost within 3 s: {pending}"
        assert "not heard from for" in pending["message"]
    else:
        assert r["pending"]["since_kill"] < 1.0, f"a killed node must be lost within 1 s: {pending}"
    if how == "handler":
        assert_raised(r["dying"], "NodeLostError")
    assert_raised(r["new_call"], "NodeLostError")
    assert r["new_call"]["seconds"] < 1.0
    assert "error" not in r["new_tell"], "a tell to a lost node is logged, not raised"
    assert_raised(r["spawn_on_lost"], "NodeLostError")
    assert_raised(r["lookup_lost"], "ActorNotFoundError")
    assert r["listed"] == ["fresh", "survivor"], "a lost node's names must disappear"
    assert r["lost_nodes"] == [1]
    told = [(record["node"], record["peer"]) for record in run.logs("node lost") if record["level"] == "warning"]
    assert told == [(0, 1)], f"one warning for the loss, from rank 0 (node 2 logs it at debug level){run.report()}"
    assert r["survivor_value"] == 6
    assert r["fresh"] == [2, 8]
    shutdown = run.result("shutdown")
    assert shutdown["result"] == "main finished"
    assert shutdown["seconds"] < 5.0, f"run() took {shutdown['seconds']:.1f} s to return after main"
    if how == "stop":
        assert run.result("stopped_worker")["dead"] == [True], "rank 0 must kill the worker it lost"
    assert run.returned() == "main finished"
    assert (tmp_path / "on_stop_survivor").exists(), "on_stop of the surviving worker's actor did not run"


@pytest.mark.timeout(60)
def test_main_raising_is_reraised_after_shutdown(tmp_path: Path) -> None:
    run = run_script("main_raises.py", str(tmp_path), timeout=45)
    run.assert_clean_exit(1)
    assert run.result("before_raise")["value"] == 1
    raised = run.result("raised")
    assert raised["type"] == "MainFailedError"
    assert raised["same_object"] is True, "run() must re-raise main's own exception"
    assert raised["seconds_after_raise"] < 15.0
    assert "Traceback (most recent call last)" in run.stderr
    assert "MainFailedError: main failed on purpose \u2717" in run.stderr, run.report()
    assert "in main" in run.stderr
    for rank in (0, 1):
        assert (tmp_path / f"on_stop_rank{rank}").exists(), f"on_stop on rank {rank} did not run{run.report()}"


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[Script]:
    script = Script(script_argv("sleeper.py", str(tmp_path)))
    try:
        yield script
    finally:
        script.kill()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", ["leader", "group"], ids=["sigint-rank0", "sigint-group"])
def test_ctrl_c_ends_the_whole_system(target: str, sleeper: Script, tmp_path: Path) -> None:
    wait_for_file(tmp_path / "ready", sleeper, timeout=60)
    sent = time.monotonic()
    if target == "leader":
        sleeper.signal_leader(signal.SIGINT)
    else:
        sleeper.signal_group(signal.SIGINT)
    run = sleeper.finish(timeout=30)
    assert not run.timed_out, f"Ctrl-C did not end the run{run.report()}"
    assert run.ended_at - sent < 15.0, f"exit took {run.ended_at - sent:.1f} s after SIGINT{run.report()}"
    assert run.returncode != 0, "an interrupted run must not report success"
    assert not run.leftovers, f"processes were left behind{run.report()}"
    for rank in (0, 1):
        assert (tmp_path / f"on_stop_rank{rank}").exists(), f"on_stop on rank {rank} did not run{run.report()}"


# --------------------------------------------------------------------------- noise (last: -x stops here)


@pytest.mark.timeout(FIRST_USE)
def test_normal_run_prints_no_cpp_or_gloo_warnings(basics: Finished) -> None:
    """basics.py imports torch before actorch, in the usual (isort) order."""
    assert_no_torch_noise(basics)


@pytest.fixture(scope="module")
def two_worlds() -> Finished:
    """One run of ``two_worlds.py`` shared by the tests of this module that read it."""
    return run_script("two_worlds.py", timeout=75)


@pytest.mark.timeout(90)
def test_a_script_can_run_two_worlds_one_after_the_other(two_worlds: Finished) -> None:
    two_worlds.assert_clean_exit(0)
    r = two_worlds.result("two_worlds")
    assert r["first"]["value"] == r["second"]["value"] == 11
    assert r["first"]["worker_pid"] != r["second"]["worker_pid"]


@pytest.mark.timeout(90)
def test_rank_zero_listens_on_loopback_only_by_default(two_worlds: Finished) -> None:
    two_worlds.assert_clean_exit(0)
    listening = two_worlds.result("two_worlds")["first"]["listening"]
    assert listening, "rank 0 should be listening for its peers"
    loopback = "0100007F"  # 127.0.0.1 as /proc/net/tcp prints it
    elsewhere = [address for address in listening if address.split(":")[0] != loopback]
    assert not elsewhere, f"rank 0 listens beyond loopback: {elsewhere}"


@pytest.fixture(scope="module")
def devices() -> Finished:
    """One run of ``devices.py both``: the strict world, then the staged one, in one process."""
    return run_script("devices.py", "both", timeout=120)


@pytest.mark.timeout(150)
def test_a_tensor_off_the_cpu_is_refused_under_strict_devices_and_the_node_keeps_serving(devices: Finished) -> None:
    run = devices
    run.assert_clean_exit(0)
    r = run.result("strict")
    argument = assert_raised(r["argument"], "SerializationError", "ActorchError")
    # each names the message first (the endpoint, the actor, the node), then where the tensor sits in it
    assert re.match(
        r"call to 'echo' of actor \S+ on node 1: args\[0\]\['obs'\]\[0\]: a tensor on meta cannot go to node 1",
        argument["message"],
    ), argument["message"]
    assert "devices='strict'" in argument["message"]
    result = assert_raised(r["result"], "SerializationError", "ActorchError")
    assert "on node 1 (call " in result["message"]
    assert "): value: a tensor on meta cannot go to node 0" in result["message"]
    told = assert_raised(r["tell"], "SerializationError")["message"]
    assert re.match(r"tell of '\w+' to actor \S+ on node 1: args\[0\]: a tensor on meta", told), told
    missing = assert_raised(r["on_missing_gpu"], "PlacementError", "ActorchError")
    assert missing["type"] == "PlacementError", missing  # refused by the caller, not an actor's RemoteError
    assert missing["message"] == "cannot place Holder on cuda:0: node 1 has no GPU"
    assert r["devices"] == [[], []]
    assert r["still_serving"] == "pong"
    assert r["cpu_ok"] == [1.0, 1.0]
    assert r["lost"] == {}


@pytest.mark.timeout(150)
def test_a_tensor_no_map_covers_is_staged_between_processes_to_the_receiving_actors_device(devices: Finished) -> None:
    run = devices
    run.assert_clean_exit(0)
    r = run.result("staged")
    assert r["devices"] == [["cuda:0", "cuda:1"], ["cuda:0", "cuda:1"]]
    assert r["to_gpu_actor"] == [[107.0, 107.0], [1.0]]  # staged, then moved; a CPU tensor is left alone
    assert r["to_cpu_actor"] == [7.0, 7.0]  # staged; a CPU actor keeps it on the host
    assert r["result_to_main"] == [7.0, 7.0]  # main is no actor: the host
    assert r["result_to_gpu_actor"] == [107.0, 107.0]  # the calling actor's device
    assert r["where"] == "cuda:1"
    assert r["big"] == [1_500_000, [107.0]], "two chunks, each read once landed, then moved"
    assert r["through_shared_memory"] >= 3, "on one host the host copies go through segments, no socket"
