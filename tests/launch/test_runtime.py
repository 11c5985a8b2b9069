"""Runtime files, how ``actorch status`` and ``actorch stop`` find a system of this host, in one process.

A "system" here is any process with a runtime file; a sleeping child process
stands in for rank 0 where a test needs one to signal. The real systems are
in ``test_cli``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import actorch
from actorch._launch.cli import command as cli
from actorch._launch.cli.status import fetch_status
from actorch._launch.services.runtime import Announcement, running_systems, runtime_dir, status_address


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "runtime"
    monkeypatch.setenv("ACTORCH_RUNTIME_DIR", str(path))
    monkeypatch.delenv("ACTORCH_STATUS_PORT", raising=False)
    return path


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child process that a runtime file can name as rank 0 (ended by SIGTERM, or killed after the test)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    child.kill()
    child.wait()


def announce(runtime: Path, pid: int, status: str | None, argv: list[str], started: float = 1.0) -> Path:
    """A runtime file for process ``pid``, as rank 0 would write it."""
    runtime.mkdir(mode=0o700, exist_ok=True)
    path = runtime / f"{pid}.json"
    record = {"schema": 1, "pid": pid, "status": status, "argv": argv, "cwd": "/", "started": started}
    path.write_text(json.dumps({**record, "world_size": 2, "launcher": None}))
    return path


def test_an_announcement_is_found_while_it_stands_and_gone_once_withdrawn(runtime: Path) -> None:
    announced = Announcement(3, "127.0.0.1:8470")
    path = announced.publish()
    assert path == runtime / f"{os.getpid()}.json"
    assert runtime.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600
    (found,) = running_systems()
    assert (found.pid, found.status, found.world_size, found.argv) == (os.getpid(), "127.0.0.1:8470", 3, sys.argv)
    assert found.running()
    announced.withdraw()
    assert running_systems() == []
    assert not path.exists()


def test_files_of_dead_or_reused_pids_are_ignored_and_removed(runtime: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = announce(runtime, child.pid, None, ["gone.py"])
    Announcement(2, None).publish()
    reused = runtime / f"{os.getpid()}.json"
    record = json.loads(reused.read_text())
    reused.write_text(json.dumps({**record, "pid_start": record["pid_start"] + 1}))  # started later: another process
    (runtime / "junk.json").write_text("{not json")
    (runtime / "future.json").write_text(json.dumps({"schema": 99, "pid": os.getpid()}))
    assert running_systems() == []
    assert not dead.exists()
    assert not reused.exists()
    assert (runtime / "junk.json").exists()  # unreadable: maybe being written, and not ours to judge


def test_a_runtime_directory_that_others_may_write_is_refused(runtime: Path) -> None:
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o777)
    with pytest.raises(PermissionError, match="set ACTORCH_RUNTIME_DIR to a private directory"):
        runtime_dir()
    with pytest.raises(SystemExit) as ended:
        cli.main(["status"])
    assert ended.value.code == 1


@pytest.mark.parametrize(
    ("host", "port", "address"),
    [
        ("127.0.0.1", 1, "127.0.0.1:1"),
        ("0.0.0.0", 2, "127.0.0.1:2"),
        ("::", 3, "[::1]:3"),
        ("fe80::1", 4, "[fe80::1]:4"),
    ],
)
def test_a_status_address_is_one_a_client_of_this_host_reaches(host: str, port: int, address: str) -> None:
    assert status_address(host, port) == address


def test_run_announces_its_system_while_main_runs(runtime: Path) -> None:
    async def main(system: actorch.ActorSystem) -> list[tuple[int, str | None]]:
        return [(found.pid, found.status) for found in running_systems()]

    (seen,) = actorch.run(main, configure_logs=False)  # the status is served by default
    assert seen[0] == os.getpid()
    assert seen[1] is not None
    assert seen[1].startswith("127.0.0.1:")
    assert not seen[1].endswith(":0")  # the port it took, not the 0 it was asked for
    assert running_systems() == []


def test_a_system_started_with_status_false_is_announced_without_an_address(runtime: Path) -> None:
    async def main(system: actorch.ActorSystem) -> list[tuple[int, str | None]]:
        return [(found.pid, found.status) for found in running_systems()]

    assert actorch.run(main, status=False, configure_logs=False) == [(os.getpid(), None)]


async def test_start_serves_the_status_and_announces_it(runtime: Path) -> None:
    async with actorch.start(configure_logs=False) as system:
        (found,) = running_systems()
        assert found.pid == os.getpid()
        assert found.status is not None
        status = await asyncio.to_thread(fetch_status, found.status)
        assert [node["rank"] for node in status["nodes"]] == [0]
        assert status["world_size"] == system.world_size == 1
    assert running_systems() == []


def test_several_systems_are_listed_and_one_is_picked_by_pid(
    runtime: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    announce(runtime, os.getpid(), "127.0.0.1:1", ["first.py"], started=1.0)
    announce(runtime, sleeper.pid, None, ["second.py", "--fast"], started=2.0)
    assert cli.main(["status", "--list"]) == 0
    listed = capsys.readouterr().out
    assert listed.index("first.py") < listed.index("second.py --fast")
    assert "127.0.0.1:1" in listed
    for command in (["status"], ["stop"]):
        with pytest.raises(SystemExit) as ended:
            cli.main(command)
        assert ended.value.code == 2
        captured = capsys.readouterr()
        assert "second.py --fast" in captured.out  # the list, to pick from
        assert (
            captured.err.strip()
            == f"actorch {command[0]}: error: 2 actorch systems run on this host: pick one with --pid PID"
        )
    with pytest.raises(SystemExit) as ended:
        cli.main(["status", "--pid", str(sleeper.pid)])
    assert ended.value.code == 1
    assert f"the system of pid {sleeper.pid} (second.py --fast) serves no status" in capsys.readouterr().err
    for command in (["status", "--json"], ["status", "--json", "--pid", str(sleeper.pid)]):
        with pytest.raises(SystemExit) as ended:
            cli.main(command)
        captured = capsys.readouterr()
        said = json.loads(captured.out)  # JSON on stdout, whatever happened
        assert said["exit_code"] == ended.value.code
        assert said["error"] in captured.err
    assert ended.value.code == 1
    assert said["pid"] == sleeper.pid
    with pytest.raises(SystemExit) as ended:
        cli.main(["status", "--json"])
    several = json.loads(capsys.readouterr().out)
    assert ended.value.code == several["exit_code"] == 2
    assert [system["argv"] for system in several["systems"]] == [["first.py"], ["second.py", "--fast"]]
    assert cli.main(["status", "--list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["systems"] == several["systems"]
    with pytest.raises(SystemExit) as ended:
        cli.main(["status", "--pid", str(os.getpid())])  # picked: its address answers nothing
    assert ended.value.code == 1
    assert "no status at 127.0.0.1:1" in capsys.readouterr().err


def test_stop_sends_sigterm_to_rank_0_and_waits_until_it_has_exited(
    runtime: Path, sleeper: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    announce(runtime, sleeper.pid, None, ["train.py"])
    assert cli.main(["stop"]) == 0
    assert capsys.readouterr().out.strip() == f"actorch stop: stopped the system of pid {sleeper.pid} (train.py)"
    assert sleeper.wait(10) == -signal.SIGTERM


def test_stop_fails_when_rank_0_outlives_the_timeout(runtime: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert stubborn.stdout is not None
        assert stubborn.stdout.readline() == b"ready\n"
        announce(runtime, stubborn.pid, None, ["stubborn.py"])
        with pytest.raises(SystemExit) as ended:
            cli.main(["stop", "--timeout", "0.2"])
        assert ended.value.code == 1
        err = capsys.readouterr().err.strip()
        assert err == f"actorch stop: error: rank 0 (pid {stubborn.pid}) has not exited 0.2 s after SIGTERM"
        assert stubborn.poll() is None
    finally:
        stubborn.kill()
        stubborn.wait()
        assert stubborn.stdout is not None
        stubborn.stdout.close()
