"""The ``actorch`` command as a user runs it: ``actorch run``, ``status``, ``stop``, the metrics, and bad input.

Bad input and failures are tested in this process through the command's
``main``; what needs a real system or a real terminal's Ctrl-C is a
subprocess. ``actorch run -n 2`` (or ``python ops.py``) starts a system
(``tests/mp_scripts/ops.py``) that stays up until the test is done with it; it
serves its status by default, ``actorch status`` with no flags finds it by its
runtime file, and an HTTP client reads rank 0's status endpoint.
"""

from __future__ import annotations

import argparse
import http.server
import importlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from _mp import REPO, SCRIPTS, Script, free_port, refused_port, run_argv, script_env, wait_for_file
from prometheus_client.parser import text_string_to_metric_families

from actorch._launch.cli import command as cli
from actorch._launch.cli import run as cli_run
from actorch._launch.cli import runner
from actorch._launch.options.system_options import SystemOptions, recording, snapshot_directory, status_address
from actorch._launch.services.runtime import running_systems
from actorch._launch.world.run import _plan

ACTORCH = [sys.executable, "-m", "_actorch_cli"]
"""The ``actorch`` console script, as pyproject.toml's ``[project.scripts]`` makes it."""


def actorch_cli(*args: str, timeout: float = 30.0, command: list[str] = ACTORCH) -> subprocess.CompletedProcess[str]:
    """``actorch args`` (or ``command args``) to its end."""
    return subprocess.run(
        [*command, *args], cwd=REPO, env=script_env("cli"), capture_output=True, text=True, timeout=timeout, check=False
    )


def one_line(err: str) -> str:
    """The one line of ``err``; fails if there are more, or a traceback."""
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err.strip()


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty runtime directory of this test's own (no system runs, as far as the command can see)."""
    path = tmp_path / "runtime"
    monkeypatch.setenv("ACTORCH_RUNTIME_DIR", str(path))
    monkeypatch.delenv("ACTORCH_STATUS_PORT", raising=False)
    return path


@pytest.fixture
def launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``actorch run`` (and torchrun's agent) set these in its own process: put them back after the test."""
    monkeypatch.setenv("ACTORCH_WORLD_SIZE", "unset by the test")
    monkeypatch.setenv("ACTORCH_STATUS_PORT", "unset by the test")
    monkeypatch.setenv("ACTORCH_LOG_LEVEL", "unset by the test")
    monkeypatch.setenv("ACTORCH_RECORD", "unset by the test")
    monkeypatch.setenv("ACTORCH_SNAPSHOTS", "unset by the test")  # left set, later worlds of the worker would resume
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "set by torchrun's agent before it fails")


# ---------------------------------------------------------------------- one module per command


def commands_of(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (found,) = [action for action in top._actions if isinstance(action, argparse._SubParsersAction)]
    return dict(found.choices)


@pytest.mark.parametrize("name", sorted(commands_of(cli.parser())))
def test_each_command_has_its_parser_in_the_command_module_and_its_work_in_a_module_named_after_it(name: str) -> None:
    assert callable(getattr(cli, f"_add_{name}"))
    work = getattr(importlib.import_module(f"actorch._launch.cli.{name}"), f"{name}_command")
    func = commands_of(cli.parser())[name].get_default("func")
    # run and serve import torch: the parser's entry imports their module only when the command runs
    assert func is work or (func is getattr(cli, f"_{name}_command") and work.__module__ != cli.__name__)


# ---------------------------------------------------------------------- bad input: one line, exit code 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "the following arguments are required"),
        (["launch"], "invalid choice: 'launch'"),
        (["run"], "no script given"),
        (["run", "-n", "0", "examples/quickstart.py"], "expected an int >= 1"),
        (["run", "-n", "many", "examples/quickstart.py"], "expected an int >= 1"),
        (["run", "--max-restarts", "-1", "examples/quickstart.py"], "expected an int >= 0, not '-1'"),
        (["run", "--max-restarts", "x", "examples/quickstart.py"], "expected an int >= 0"),
        (["run", "--master-port", "99999", "examples/quickstart.py"], "expected a port"),
        (["run", "--status-port", "http", "examples/quickstart.py"], "expected a port"),
        (["run", "--status-port", "1", "--no-status", "examples/quickstart.py"], "not allowed with argument"),
        (["run", "--nnodes", "1:2:3", "examples/quickstart.py"], 'not in "MIN:MAX" format'),
        (["run", "--nnodes", "two", "examples/quickstart.py"], "invalid literal"),
        (["run", "-n", "2", "--redirects", "9", "examples/quickstart.py"], "9 does not match"),
        (["run", "-n", "2", "--rdzv-conf", "nonsense", "examples/quickstart.py"], "must have a value"),
        (["run", "-n", "2", "--rdzv-backend", "nosuch", "examples/quickstart.py"], "'nosuch' is not registered"),
        (["status", "--address", "127.0.0.1:abc"], "expected HOST:PORT, not '127.0.0.1:abc'"),
        (["status", "--address", "127.0.0.1"], "expected HOST:PORT"),
        (["status", "--address", ":8470"], "expected HOST:PORT"),
        (["status", "--address", "http://h:80/x:1"], "expected HOST:PORT"),
        (["status", "--address", "h:70000"], "expected a port (1..65535)"),
        (["status", "--port", "1", "--address", "h:1"], "not allowed with argument"),
        (["status", "--port", "1", "--interval", "0"], "expected seconds"),
        (["status", "--port", "1", "--interval", "nan"], "expected seconds"),
        (["status", "--pid", "-3"], "expected an int >= 0, not '-3'"),
        (["stop", "--timeout", "forever"], "expected seconds"),
        (["run", "--log-level", "loud", "examples/quickstart.py"], "invalid choice: 'loud'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str], runtime_dir: Path, launcher_env: None
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(args)
    assert ended.value.code == 2
    assert says in one_line(capsys.readouterr().err)


def test_a_bad_status_port_in_the_environment_is_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACTORCH_STATUS_PORT", "http")
    with pytest.raises(SystemExit) as ended:
        cli.main(["status"])
    assert ended.value.code == 2
    assert "ACTORCH_STATUS_PORT must be a port" in one_line(capsys.readouterr().err)


def test_a_taken_status_port_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, launcher_env: None
) -> None:
    monkeypatch.setattr(cli_run, "_torchrun", lambda *args: pytest.fail("the launch went on"))
    monkeypatch.setattr(os, "execv", lambda *args: pytest.fail("the script was started"))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        for nproc in ("1", "2"):
            with pytest.raises(SystemExit) as ended:
                cli.main(["run", "-n", nproc, "--status-port", str(port), "examples/quickstart.py"])
            assert ended.value.code == 2
            line = one_line(capsys.readouterr().err)
            assert line == f"actorch run: error: --status-port: status port {port} on 127.0.0.1 is in use"


@pytest.mark.parametrize(
    ("flags", "options"),
    [
        ([], {"status_address": ("127.0.0.1", 0), "recording": True, "log_level": "warning"}),
        (["--no-status", "--no-record"], {"status_address": None, "recording": False, "log_level": "warning"}),
        (["--status-port", "0", "--log-level", "DEBUG"], {"status_address": ("127.0.0.1", 0), "log_level": "debug"}),
        (["--snapshots", "ckpt"], {"snapshots": os.path.abspath("ckpt")}),
    ],
    ids=["none", "no status, no record", "status port, log level", "snapshots"],
)
def test_run_flags_reach_the_scripts_run_as_the_options_they_name(
    flags: list[str], options: dict[str, object], monkeypatch: pytest.MonkeyPatch, launcher_env: None
) -> None:
    for name in ("ACTORCH_STATUS_PORT", "ACTORCH_LOG_LEVEL", "ACTORCH_RECORD", "ACTORCH_SNAPSHOTS"):
        monkeypatch.delenv(name, raising=False)
    started: list[SystemOptions] = []

    def execv(*args: object) -> None:
        started.append(SystemOptions(configure_logs=False))  # what the script's run() reads, left at its defaults
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    with pytest.raises(SystemExit):
        cli.main(["run", *flags, "examples/quickstart.py"])
    (chosen,) = started
    seen = {"status_address": status_address(chosen), "recording": recording(chosen)}
    seen["log_level"] = _plan(chosen, tune_gc=True).log_level
    seen["snapshots"] = snapshot_directory(chosen)
    assert {name: seen[name] for name in options} == options


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "no/such/script.py"], "no such script: no/such/script.py"),
        (["run", "--bogus", "examples/quickstart.py"], "unrecognized arguments: --bogus"),
        (["status", "--address", "127.0.0.1:abc"], "expected HOST:PORT"),
    ],
)
def test_bad_input_from_the_shell_is_one_line_and_exit_code_2(args: list[str], says: str) -> None:
    done = actorch_cli(*args)
    assert done.returncode == 2, done
    assert says in one_line(done.stderr)


def test_help_is_complete_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    helps = {}
    for args in ([], ["run"], ["status"], ["stop"]):
        with pytest.raises(SystemExit) as ended:
            cli.main([*args, "--help"])
        assert ended.value.code == 0
        helps[tuple(args)] = capsys.readouterr().out
        assert "examples:" in helps[tuple(args)]
    for flag in (
        *cli_run.TORCHRUN_FLAGS,
        "nproc_per_node",
        "status_port",
        "no_status",
        "log_level",
        "no_record",
        "snapshots",
    ):
        assert f"--{flag.replace('_', '-')}" in helps[("run",)]
    for flag in ("--port", "--address", "--pid", "--list", "--watch", "--interval", "--count", "--json"):
        assert flag in helps[("status",)]
    for flag in ("--pid", "--timeout"):
        assert flag in helps[("stop",)]
    assert "actorch run" in actorch_cli("--help").stdout  # the command a user types
    assert "actorch run" in actorch_cli("--help", command=[sys.executable, "-m", "actorch"]).stdout


# ---------------------------------------------------------------------- a quick start: no torch where none is needed


def console_script(*args: str, runtime: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The console script (``_actorch_cli``) with ``args`` in a fresh interpreter; its run, and what it imported."""
    env = script_env("cli")
    env["ACTORCH_RUNTIME_DIR"] = str(runtime)
    env["ACTORCH_RUNS_DIR"] = str(runtime.parent / "runs")
    env.pop("ACTORCH_STATUS_PORT", None)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "_actorch_cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stderr.splitlines()
    imported = {line.rpartition("|")[2].strip() for line in lines if line.startswith("import time:")}
    said = "\n".join(line for line in lines if not line.startswith("import time:"))
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, said), imported


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--help"], 0, ""),
        (["status", "--help"], 0, ""),
        (["status"], 1, "actorch status: error: no actorch system runs on this host"),
        (["status", "--list"], 0, ""),
        (["stop", "--pid", "1"], 1, "actorch stop: error: no actorch system whose rank 0 has pid 1"),
        (["launch"], 2, "invalid choice: 'launch'"),
        (["run", "-n", "0", "examples/quickstart.py"], 2, "expected an int >= 1"),
        (["serve", "--resource", "gpus"], 2, "expected NAME=AMOUNT, not 'gpus'"),
        (["status", "--address", "127.0.0.1"], 2, "expected HOST:PORT"),
        (["stacks", "--help"], 0, ""),
        (["stacks"], 1, "actorch stacks: error: no actorch system runs on this host"),
        (["history"], 0, ""),
        (["history", "nope"], 1, "actorch history: no runs recorded"),
    ],
)
def test_help_status_stop_and_bad_input_do_not_import_torch(
    args: list[str], code: int, says: str, tmp_path: Path
) -> None:
    done, imported = console_script(*args, runtime=tmp_path / "runtime")
    assert done.returncode == code, done.stderr
    assert says in done.stderr
    assert "actorch._launch.cli.command" in imported  # what it imported was read
    assert not {name for name in imported if name.partition(".")[0] == "torch"}


def test_the_console_script_runs_the_facade_once_a_name_is_asked_of_the_package(tmp_path: Path) -> None:
    check = (
        "import sys, _actorch_cli\n"
        "try:\n"
        "    _actorch_cli.main(['status', '--list'])\n"
        "finally:\n"
        "    print('torch before:', 'torch' in sys.modules)\n"
        "import actorch\n"
        "from actorch import Actor\n"
        "print('missing:', sorted(set(actorch.__all__) - set(vars(actorch))))\n"
        "print('same:', actorch.Actor is Actor, Actor.__module__, hasattr(actorch, 'no_such_name'))\n"
    )
    env = script_env("cli")
    env["ACTORCH_RUNTIME_DIR"] = str(tmp_path / "runtime")
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-3:] == ["torch before: False", "missing: []", "same: True actorch False"]


# ---------------------------------------------------------------------- failures: one line, exit code 1


class _Answers(http.server.BaseHTTPRequestHandler):
    """Another service on the port: an HTML page, JSON of another kind, or 404."""

    def do_GET(self) -> None:
        kind = self.server.kind  # type: ignore[attr-defined]
        if kind == "404":
            self.send_error(404)
            return
        body = b"<html>hello</html>" if kind == "html" else b'{"nodes": "not these"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_service() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def not_http() -> Iterator[int]:
    """A port where a service answers with a banner that is not HTTP, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    listener.close()
    thread.join(5)


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("html", "the answer is not JSON (is it another service?)"),
        ("json", "the answer is JSON of another kind"),
        ("404", "it answered HTTP 404 Not Found (is it another service?)"),
    ],
)
def test_status_of_another_http_service_is_one_line_and_exit_code_1(
    kind: str,
    says: str,
    other_service: http.server.HTTPServer,
    capsys: pytest.CaptureFixture[str],
    runtime_dir: Path,
) -> None:
    other_service.kind = kind  # type: ignore[attr-defined]
    port = other_service.server_address[1]
    with pytest.raises(SystemExit) as ended:
        cli.main(["status", "--port", str(port)])
    assert ended.value.code == 1
    assert one_line(capsys.readouterr().err) == f"actorch status: error: no actorch status at 127.0.0.1:{port}: {says}"


def test_status_of_a_service_that_is_not_http_is_one_line_and_exit_code_1(
    not_http: int, capsys: pytest.CaptureFixture[str], runtime_dir: Path
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["status", "--address", f"127.0.0.1:{not_http}", "--watch"])
    assert ended.value.code == 1
    assert "the answer is not HTTP" in one_line(capsys.readouterr().err)


def test_status_of_nothing_says_so_with_exit_code_1(capsys: pytest.CaptureFixture[str], runtime_dir: Path) -> None:
    with refused_port() as port:
        check_status_of_nothing(capsys, port)


def check_status_of_nothing(capsys: pytest.CaptureFixture[str], port: int) -> None:
    for args, says in (
        (["status", "--port", str(port)], "no status at 127.0.0.1:"),
        (["status"], "no actorch system runs on this host"),
        (["status", "--pid", "4194305"], "no actorch system whose rank 0 has pid 4194305"),
        (["stop"], "no actorch system runs on this host"),
    ):
        with pytest.raises(SystemExit) as ended:
            cli.main(args)
        assert ended.value.code == 1, args
        assert says in one_line(capsys.readouterr().err)
        if args[0] == "status":  # --json: the error as JSON on stdout too
            with pytest.raises(SystemExit) as ended:
                cli.main([*args, "--json"])
            captured = capsys.readouterr()
            said = json.loads(captured.out)
            assert ended.value.code == said["exit_code"] == 1, args
            assert says in said["error"]
            assert said["error"] in one_line(captured.err)


# ---------------------------------------------------------------------- actorch run


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_run_starts_the_quickstart_on_two_local_processes_with_a_log_file_per_rank(tmp_path: Path) -> None:
    run = run_argv(
        [*ACTORCH, "run", "-n", "2", "--log-dir", str(tmp_path), "--redirects", "3", "examples/quickstart.py"],
        timeout=75,
    )
    run.assert_clean_exit(0)
    logs = {path.parent.name: path.read_text() for path in tmp_path.glob("*/attempt_0/*/stdout.log")}
    assert "main runs on node 0 of a 2-node system" in logs["0"]
    assert "on node 1] started at 10" in logs["1"]
    assert "main runs on" not in run.stdout  # redirected: the console has none of it


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_run_with_torchruns_flags_hands_over_to_torch_distributed_run() -> None:
    argv = [*ACTORCH, "run", "-n", "2", "--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1"]
    run = run_argv([*argv, "--master-port", str(free_port()), "examples/quickstart.py"], timeout=100)
    run.assert_clean_exit(0)
    assert "main runs on node 0 of a 2-node system" in run.stdout  # quickstart.py says world_size=3
    ignored = "run(world_size=3) is ignored: actorch run started 2 processes, and the launcher's count is the system's"
    assert run.stderr.count(ignored) == 1, f"rank 0 says so, once{run.report()}"


BAD_INPUT = """import actorch


async def main(system: actorch.ActorSystem) -> None:
    raise ValueError("bad input")


if __name__ == "__main__":
    actorch.run(main)
"""
"""A script whose ``main`` fails, for every launcher."""


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_failed_run_prints_the_traceback_once_and_ends_naming_the_rank_and_the_error(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(BAD_INPUT)
    run = run_argv([*ACTORCH, "run", "-n", "3", str(script)], timeout=75)
    run.assert_clean_exit(1)
    assert run.stderr.count("Traceback (most recent call last)") == 1, run.report()
    assert run.stderr.count('raise ValueError("bad input")') == 1, run.report()
    assert not re.search(r"^[EW]\d{4} ", run.stderr, re.MULTILINE), f"no line from torchrun's agent{run.report()}"
    assert run.stderr.rstrip().splitlines()[-1] == f"actorch run: {script} failed on rank 0: ValueError: bad input"


def test_a_failed_script_on_one_process_ends_naming_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text('raise ValueError("bad input")\n')
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert runner.main([str(script)]) == 1  # what actorch run -n 1 runs, in place of itself
    err = capsys.readouterr().err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert err.rstrip().splitlines()[-2:] == [
        "ValueError: bad input",
        f"actorch run: {script} failed on rank 0: ValueError: bad input",
    ]


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_failed_run_with_stderr_in_log_files_prints_the_traceback_it_did_not_show(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(BAD_INPUT)
    logs = tmp_path / "logs"
    run = run_argv([*ACTORCH, "run", "-n", "2", "--log-dir", str(logs), "--redirects", "2", str(script)], timeout=75)
    run.assert_clean_exit(1)
    [logged] = [path.read_text() for path in logs.glob("*/attempt_0/0/stderr.log")]
    assert logged.count('raise ValueError("bad input")') == 1, logged
    said = run.stderr.rstrip().splitlines()
    shown = said.index("actorch run: rank 0's traceback (its stderr went to a log file):")
    assert said[shown + 1] == "Traceback (most recent call last):", run.report()
    assert run.stderr.count('raise ValueError("bad input")') == 1, run.report()
    assert said[-2:] == ["ValueError: bad input", f"actorch run: {script} failed on rank 0: ValueError: bad input"]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_restarted_group_gets_a_snapshotting_actors_state_back(tmp_path: Path) -> None:
    run = run_argv(
        [*ACTORCH, "run", "-n", "2", "--max-restarts", "1", str(SCRIPTS / "restart.py"), str(tmp_path)], timeout=100
    )
    run.assert_clean_exit(0)
    assert run.result("attempt0") == {"check": "attempt0", "size": 0, "restored": False}
    assert run.result("attempt1") == {"check": "attempt1", "size": 10, "restored": True}  # the group restarted
    assert "RETURNED 10" in run.stdout


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_script_without_the_main_guard_fails_naming_the_workers_error_and_the_fix(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import actorch\n\n\n"
        "async def main(system: actorch.ActorSystem) -> None:\n"
        "    pass\n\n\n"
        "actorch.run(main, world_size=2)\n"
    )
    run = run_argv([sys.executable, str(script)], timeout=75)
    run.assert_clean_exit(1)
    last = run.stderr.rstrip().splitlines()[-1]
    assert last.startswith("RuntimeError: actor system failed to start: actorch-node1 exited with code 1: ")
    assert f"{script} calls actorch.run() when it is imported" in last
    assert 'put the call under `if __name__ == "__main__":`' in last


# ---------------------------------------------------------------------- a live system: status, metrics, Ctrl-C


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_status_finds_watches_and_scrapes_a_live_system_and_ctrl_c_ends_it(tmp_path: Path) -> None:
    system = Script([*ACTORCH, "run", "-n", "2", str(SCRIPTS / "ops.py"), str(tmp_path)])  # no status flag
    try:
        wait_for_file(tmp_path / "ready", system, 60)
        (found,) = running_systems()  # it serves its status on a free port, which its runtime file holds
        assert found.argv == [str(SCRIPTS / "ops.py"), str(tmp_path)]
        assert found.world_size == 2
        address = found.status
        assert address is not None
        assert address.startswith("127.0.0.1:")

        listed = actorch_cli("status", "--list")
        assert listed.returncode == 0, listed.stderr
        assert str(found.pid) in listed.stdout
        assert address in listed.stdout

        once = actorch_cli("status")  # no flags: the one system of this host
        assert once.returncode == 0, once.stderr
        assert "nodes (2)" in once.stdout
        assert "ops/counter0" in once.stdout
        assert "ops/counter1" in once.stdout
        assert "alive" in once.stdout

        watched = actorch_cli("status", "--watch", "--count", "3", "--interval", "0.2")
        assert watched.returncode == 0, watched.stderr
        assert watched.stdout.count("--- ") == 3  # three refreshes, each headed when not on a terminal
        assert watched.stdout.count("nodes (2)") == 3

        raw = json.loads(actorch_cli("status", "--json").stdout)
        assert raw["schema"] == 5
        assert [node["rank"] for node in raw["nodes"]] == [0, 1]
        counters = {actor["name"]: actor for node in raw["nodes"] for actor in node["actors"]}
        for counter in counters.values():
            assert counter["handled"] == sum(endpoint["calls"] for endpoint in counter["endpoints"].values())
        add = counters["ops/counter1"]["endpoints"]["add"]
        assert add["calls"] >= 20
        assert add["errors"] == 0
        assert counters["ops/counter1"]["endpoints"]["explode"]["errors"] == 1
        assert 0 < add["p50"] <= add["p99"] < 1.0
        assert raw["nodes"][1]["statistics"]["bytes_received"] > 0

        url = f"http://{address}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
        }
        counter1 = (("actor", "ops/counter1"), ("actor_class", "Counter"), ("node", "1"))
        assert samples["actorch_messages_handled_total", (*counter1[:2], ("endpoint", "add"), counter1[2])] >= 20
        explode0 = (("actor", "ops/counter0"), ("actor_class", "Counter"), ("endpoint", "explode"), ("node", "0"))
        assert samples["actorch_handler_errors_total", explode0] == 1
        add1 = (*counter1[:2], ("endpoint", "add"), counter1[2])
        assert samples["actorch_handler_seconds_count", add1] >= 20
        assert samples["actorch_handler_seconds_bucket", (*add1[:3], ("le", "+Inf"), add1[3])] >= 20
        assert 0 < samples["actorch_handler_seconds_sum", add1] < 20.0
        assert samples["actorch_mailbox_wait_seconds_count", counter1] >= 21  # every run of its endpoints
        assert samples["actorch_mailbox_depth", counter1] >= 0
        assert samples["actorch_node_up", (("node", "1"),)] == 1
        for rank in ("0", "1"):
            for path in ("lane", "torch_rpc"):  # the tensors went by torch RPC, and their replies came back on it
                assert samples["actorch_sent_bytes_total", (("node", rank), ("path", path))] > 0
                assert samples["actorch_received_bytes_total", (("node", rank), ("path", path))] > 0
            assert samples["actorch_bytes_received_total", (("node", rank),)] > 0  # a deprecated alias
            assert samples["actorch_event_loop_lag_seconds", (("node", rank),)] >= 0
            assert samples["actorch_event_loop_probe_lag_seconds_count", (("node", rank),)] >= 1
        assert samples["actorch_sent_tensor_bytes_total", (("node", "0"),)] >= 16384 * 4  # to ops/counter1

        for method, path, code in (("POST", "/status", 405), ("GET", "/spawn", 404), ("DELETE", "/metrics", 405)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(f"{url}{path}", method=method), timeout=10)
            assert refused.value.code == code
            refused.value.close()

        watched_ctrl_c = _ctrl_c_while_watching(tmp_path)
        assert watched_ctrl_c.returncode == 0  # Ctrl-C is how a watch ends
        assert watched_ctrl_c.stderr == ""
    except BaseException:
        system.kill()
        raise
    system.signal_group(signal.SIGINT)  # Ctrl-C in the terminal of actorch run
    finished = system.finish(60)
    finished.assert_clean_exit(130)
    assert "Traceback" not in finished.stderr, finished.report()
    assert finished.stderr.rstrip().splitlines()[-1] == "actorch run: interrupted"
    assert running_systems() == []  # its runtime file went with it


def _ctrl_c_while_watching(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``actorch status --watch`` in a session of its own, Ctrl-C'd (SIGINT to its group) after its first refresh."""
    out, err = tmp_path / "watch.out", tmp_path / "watch.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        watcher = subprocess.Popen(
            [*ACTORCH, "status", "--watch", "--interval", "0.2"],
            cwd=REPO,
            env=script_env("cli-watch"),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "nodes (2)" not in out.read_text():
            assert watcher.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "no refresh in 60 s"
            time.sleep(0.05)
        os.killpg(watcher.pid, signal.SIGINT)
        code = watcher.wait(30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    return subprocess.CompletedProcess(watcher.args, code, out.read_text(), err.read_text())


# ---------------------------------------------------------------------- actorch stop


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_status_and_stop_find_a_plain_run_without_any_status_option(tmp_path: Path) -> None:
    system = Script([sys.executable, str(SCRIPTS / "ops.py"), str(tmp_path), "2"])  # run(main, world_size=2)
    try:
        wait_for_file(tmp_path / "ready", system, 60)
        (found,) = running_systems()
        assert found.status is not None
        shown = actorch_cli("status", "--json")
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        assert [node["rank"] for node in status["nodes"]] == [0, 1]
        assert {actor["name"] for node in status["nodes"] for actor in node["actors"]} == {
            "ops/counter0",
            "ops/counter1",
        }
        stopped = actorch_cli("stop", "--timeout", "30")
        assert stopped.returncode == 0, stopped.stderr
    finally:
        finished = system.finish(30)
    finished.assert_clean_exit(143)  # SIGTERM to rank 0: every actor stops in order
    assert running_systems() == []


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_stop_ends_a_system_run_through_torchrun_in_order(tmp_path: Path) -> None:
    system = Script([*ACTORCH, "run", "-n", "2", "--no-status", str(SCRIPTS / "ops.py"), str(tmp_path)])
    try:
        wait_for_file(tmp_path / "ready", system, 60)
        (found,) = running_systems()
        assert found.status is None  # it serves no status, and is found all the same
        shown = actorch_cli("status", "--json")
        assert shown.returncode == 1
        said = json.loads(shown.stdout)
        assert said["pid"] == found.pid
        assert said["error"].endswith(
            "serves no status: it was started with run(..., status=False) or actorch run "
            "--no-status (actorch stop still finds it)"
        )
        assert found.launcher == system.proc.pid  # actorch run is torchrun's agent
        stopped = actorch_cli("stop", "--timeout", "30")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == f"actorch stop: stopped the system of pid {found.pid} ({found.script})"
        assert not found.running()
    finally:
        finished = system.finish(30)
    finished.assert_clean_exit(130)  # stopped as Ctrl-C stops it: in order, every rank following rank 0
    assert "Traceback" not in finished.stderr, finished.report()
    assert finished.stderr.rstrip().splitlines()[-1] == "actorch run: interrupted"
    assert running_systems() == []  # rank 0 withdrew its runtime file on its way out
