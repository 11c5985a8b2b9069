"""The ``actorch`` command as a user runs it: ``actorch run``, ``actorch status``, the metrics, and bad input.

Every case is a subprocess. ``actorch run -n 2 --status-port P`` starts a
system (``tests/mp_scripts/ops.py``) that stays up until the test is done with
it; ``actorch status`` and an HTTP client then read rank 0's status endpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from _mp import REPO, SCRIPTS, Script, free_port, run_argv, script_env, wait_for_file

from actorch._launch import cli

ACTORCH = [sys.executable, "-m", "actorch"]


def actorch_cli(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``python -m actorch args`` to its end."""
    return subprocess.run(
        [*ACTORCH, *args], cwd=REPO, env=script_env("cli"), capture_output=True, text=True, timeout=timeout, check=False
    )


# ---------------------------------------------------------------------- bad input: one line, exit code 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "the following arguments are required"),
        (["launch"], "invalid choice: 'launch'"),
        (["run"], "no script given"),
        (["run", "-n", "0", "examples/quickstart.py"], "expected an int >= 1"),
        (["run", "--master-port", "99999", "examples/quickstart.py"], "expected a port"),
        (["status"], "give --port or --address"),
        (["status", "--port", "1", "--address", "h:1"], "not allowed with argument"),
        (["status", "--port", "1", "--interval", "0"], "expected seconds"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ACTORCH_STATUS_PORT", raising=False)
    with pytest.raises(SystemExit) as ended:
        cli.main(args)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert says in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "no/such/script.py"], "no such script: no/such/script.py"),
        (["run", "--bogus", "examples/quickstart.py"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_from_the_shell_is_one_line_and_exit_code_2(args: list[str], says: str) -> None:
    done = actorch_cli(*args)
    assert done.returncode == 2, done
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_help_is_complete_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    helps = {}
    for args in ([], ["run"], ["status"]):
        with pytest.raises(SystemExit) as ended:
            cli.main([*args, "--help"])
        assert ended.value.code == 0
        helps[tuple(args)] = capsys.readouterr().out
        assert "examples:" in helps[tuple(args)]
    for flag in ("-n", "--status-port", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-endpoint"):
        assert flag in helps[("run",)]
    for flag in ("--port", "--address", "--watch", "--interval", "--count", "--json"):
        assert flag in helps[("status",)]
    assert "actorch run" in actorch_cli("--help").stdout  # the command a user types: python -m actorch


def test_status_of_nothing_says_so_with_exit_code_1() -> None:
    done = actorch_cli("status", "--port", str(free_port()))
    assert done.returncode == 1
    assert "no status at 127.0.0.1:" in done.stderr


# ---------------------------------------------------------------------- actorch run


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_run_starts_the_quickstart_on_two_local_processes() -> None:
    run = run_argv([*ACTORCH, "run", "-n", "2", "examples/quickstart.py"], timeout=75)
    run.assert_clean_exit(0)
    assert "main runs on node 0 of a 2-node system" in run.stdout
    assert "on node 1" in run.stdout


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_run_with_torchruns_flags_hands_over_to_torch_distributed_run() -> None:
    argv = [*ACTORCH, "run", "-n", "2", "--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1"]
    run = run_argv([*argv, "--master-port", str(free_port()), "examples/quickstart.py"], timeout=100)
    run.assert_clean_exit(0)
    assert "main runs on node 0 of a 2-node system" in run.stdout


# ---------------------------------------------------------------------- actorch status and the metrics


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_status_watch_json_and_metrics_of_a_live_system(tmp_path: Path) -> None:
    port = free_port()
    system = Script([*ACTORCH, "run", "-n", "2", "--status-port", str(port), str(SCRIPTS / "ops.py"), str(tmp_path)])
    try:
        wait_for_file(tmp_path / "ready", system, 60)

        once = actorch_cli("status", "--port", str(port))
        assert once.returncode == 0, once.stderr
        assert "nodes (2)" in once.stdout
        assert "ops/counter0" in once.stdout
        assert "ops/counter1" in once.stdout
        assert "alive" in once.stdout

        watched = actorch_cli("status", "--port", str(port), "--watch", "--count", "3", "--interval", "0.2")
        assert watched.returncode == 0, watched.stderr
        assert watched.stdout.count("--- ") == 3  # three refreshes, each headed when not on a terminal
        assert watched.stdout.count("nodes (2)") == 3

        raw = json.loads(actorch_cli("status", "--port", str(port), "--json").stdout)
        assert [node["rank"] for node in raw["nodes"]] == [0, 1]
        counters = {actor["name"]: actor for node in raw["nodes"] for actor in node["actors"]}
        add = counters["ops/counter1"]["endpoints"]["add"]
        assert add["calls"] >= 20
        assert add["errors"] == 0
        assert counters["ops/counter1"]["endpoints"]["explode"]["errors"] == 1
        assert 0 < add["p50"] <= add["p99"] < 1.0
        assert raw["nodes"][1]["statistics"]["bytes_received"] > 0

        url = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        assert 'actorch_messages_handled_total{actor_class="Counter",endpoint="add",node="1"}' in metrics
        assert 'actorch_handler_errors_total{actor_class="Counter",endpoint="explode",node="0"} 1.0' in metrics
        assert 'actorch_handler_seconds_bucket{actor_class="Counter",endpoint="add",le="+Inf",node="0"}' in metrics
        assert 'actorch_node_up{node="1"} 1.0' in metrics
        assert "actorch_mailbox_depth{" in metrics
        assert 'actorch_bytes_received_total{node="0"}' in metrics

        for method, path, code in (("POST", "/status", 405), ("GET", "/spawn", 404), ("DELETE", "/metrics", 405)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(f"{url}{path}", method=method), timeout=10)
            assert refused.value.code == code
            refused.value.close()
    finally:
        (tmp_path / "done").write_text("done")
        finished = system.finish(60)
    finished.assert_clean_exit(0)
    assert "RETURNED 'watched'" in finished.stdout
