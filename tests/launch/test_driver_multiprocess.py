"""Drivers other than ``run``'s ``main``, over real processes: ``connect``, ``serve(setup=f(system))``, ``start``.

Each test runs ``tests/mp_scripts/driver.py`` in one mode (see its docstring).
The notebook test (``test_notebook``) drives ``start`` from a Jupyter kernel.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from _mp import Script, pid_gone, run_script, script_argv, wait_for_file

pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(150)
def test_a_connected_driver_spawns_looks_up_and_calls_then_leaves_and_serve_setup_gets_the_system(
    tmp_path: Path,
) -> None:
    run = run_script("driver.py", "joiners", str(tmp_path), timeout=120)
    run.assert_clean_exit(0)
    joiners = run.result("joiners")
    assert joiners["codes"] == {"connected": 0, "served": 0}, joiners
    driver = joiners["driver"]
    assert isinstance(driver, dict), f"the driver printed no result:\n{driver}"
    rank = driver["rank"]
    assert rank >= 2  # a fresh rank after the launch's own two
    assert driver["here"] == [rank, driver["pid"]]  # spawned on its own node, in its own process
    assert driver["there"][0] == 1
    assert driver["found"][0] == 1  # it looks up what main spawned
    assert "driver" in driver["labels"]
    assert joiners["driven_where"] == driver["here"]  # rank 0 found and called what the driver hosts
    served_rank, served_pid = joiners["served_where"]
    assert served_pid == joiners["pids"]["served"]  # setup spawned it on the serving node
    assert served_rank not in (0, 1, rank)
    # Both left gracefully: their own actors stopped (on_stop ran) and their names went; node 1's stayed.
    assert joiners["names"] == ["driver/there", "main/worker"]
    assert joiners["stopped"] == ["stopped-driver_here", "stopped-served_here"]
    assert f"NodeLeft {rank}" in joiners["events"]
    assert f"NodeLeft {served_rank}" in joiners["events"]
    assert not any(event.startswith("NodeLost") for event in joiners["events"])
    assert joiners["nodes"] == [0, 1]
    left = (tmp_path / "connected.out").read_text()
    assert '"check": "left", "shutdown_again": "None"' in left, left


@pytest.mark.timeout(120)
def test_a_program_that_returns_without_shutting_down_still_stops_every_actor_and_its_workers(
    tmp_path: Path,
) -> None:
    run = run_script("driver.py", "forgot", str(tmp_path), timeout=90)
    run.assert_clean_exit(0)
    assert run.result("forgot")["where"][0] == 1
    for rank in (0, 1):
        assert (tmp_path / f"on_stop_rank{rank}").exists(), f"on_stop on rank {rank} did not run{run.report()}"


@pytest.mark.timeout(120)
def test_a_process_that_exits_with_its_started_system_up_takes_its_workers_along(tmp_path: Path) -> None:
    # Without the exit hook, multiprocessing would wait for the worker, which outlives SIGTERM by 2 * stop_grace.
    run = run_script("driver.py", "exits", str(tmp_path), timeout=30)
    run.assert_clean_exit(0)
    assert run.result("exits")["where"][0] == 1


@pytest.mark.timeout(120)
def test_the_workers_of_a_started_system_end_when_its_process_is_killed(tmp_path: Path) -> None:
    script = Script(script_argv("driver.py", "killed", str(tmp_path)))
    try:
        wait_for_file(tmp_path / "ready", script, timeout=60)
        worker = int((tmp_path / "ready").read_text())
        assert not pid_gone(worker)
        os.kill(script.proc.pid, signal.SIGKILL)  # a kernel that dies: no clean-up runs in it
        run = script.finish(timeout=30)
    finally:
        script.kill()
    assert run.returncode == -signal.SIGKILL
    assert not run.leftovers, f"the worker outlived its rank 0{run.report()}"
    assert pid_gone(worker)
