"""What ``actorch status`` and the metrics read, in one process: counters, histograms, the endpoint, the exporter.

The command itself, a live multi-process system and the HTTP scrape are in
``test_cli``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any

import pytest
import structlog
from actors import Counter

import actorch
from actorch._launch.cli.tables import status_tables
from actorch._launch.services.prometheus import metrics_text
from actorch._launch.services.status import STATUS_SCHEMA, StatusServer, gather_status
from actorch._launch.world import run as run_module
from actorch.testing import LocalWorld


async def test_every_handled_message_is_counted_under_its_endpoint(world: LocalWorld, on: int) -> None:
    counter = await world[0].spawn(Counter, name="status/counter", on=on)
    for _ in range(5):
        await counter.call(Counter.add)
    counter.tell(Counter.add)
    with pytest.raises(ValueError, match="boom"):
        await counter.call(Counter.explode, "boom")
    await counter.call(Counter.get)
    status = await gather_status(world._hosts[0])
    assert [node["rank"] for node in status["nodes"]] == [0, 1, 2]
    (actor,) = [a for node in status["nodes"] for a in node["actors"] if a["name"] == "status/counter"]
    assert actor["class"] == "Counter"
    assert actor["endpoints"]["add"]["calls"] == 6  # calls and the tell
    assert actor["endpoints"]["explode"]["errors"] == 1
    assert actor["endpoints"]["get"]["calls"] == 1
    assert actor["handled"] == 8  # as its endpoints count, not its on_start (nor any hook)
    assert actor["hooks"] == {"on_start": 1}  # the hooks apart
    assert actor["queued"] == 0
    assert status["schema"] == STATUS_SCHEMA
    _, actors = status_tables(status, None)
    assert list(actors.columns[7].cells) == [str(a["handled"]) for n in status["nodes"] for a in n["actors"]]
    assert "8" in actors.columns[7].cells
    node = status["nodes"][on]
    assert node["uptime"] > 0
    if on != 0:
        assert node["statistics"]["bytes_received"] > 0


async def test_a_stopped_actors_record_counts_handled_as_the_status_does_and_lists_its_hooks_apart(
    world: LocalWorld, on: int
) -> None:
    counter = await world[0].spawn(Counter, name="status/recorded", on=on)
    for _ in range(3):
        await counter.call(Counter.add)
    status = await gather_status(world._hosts[0])
    (shown,) = [a for node in status["nodes"] for a in node["actors"] if a["name"] == "status/recorded"]
    with structlog.testing.capture_logs() as logs:
        await counter.stop()
    (stopped,) = [log for log in logs if log["event"] == "actor stopped" and "status/recorded" in log["actor"]]
    recorded = stopped["statistics"]  # what a run's record keeps, and actorch history shows
    assert recorded["handled"] == shown["handled"] == 3
    assert (shown["hooks"], recorded["hooks"]) == ({"on_start": 1}, {"on_start": 1, "on_stop": 1})


async def test_status_shows_a_lost_node_as_lost(world: LocalWorld) -> None:
    world.kill(2)
    await asyncio.sleep(0)
    status = await gather_status(world._hosts[0])
    assert status["nodes"][2] == {"rank": 2, "lost": "killed by the test"}
    assert b'actorch_node_up{node="2"} 0.0' in metrics_text(status)


async def _request(port: int, raw: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_the_status_server_answers_get_status_and_metrics_and_refuses_the_rest(world: LocalWorld) -> None:
    await world[0].spawn(Counter, name="served", on=1)
    server = StatusServer(world._hosts[0], "127.0.0.1", 0)
    await server.start()
    try:
        code, body = await _request(server.port, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert code == 200
        assert json.loads(body)["world_size"] == 3
        code, body = await _request(server.port, b"GET /metrics?x=1 HTTP/1.1\r\n\r\n")
        assert code == 200
        assert b"actorch_node_up" in body
        assert (await _request(server.port, b"POST /status HTTP/1.1\r\n\r\n"))[0] == 405
        assert (await _request(server.port, b"GET /stop HTTP/1.1\r\n\r\n"))[0] == 404
        assert (await _request(server.port, b"garbage"))[0] == 400
    finally:
        await server.close()


@pytest.mark.parametrize(
    ("kwargs", "env", "match"),
    [
        ({"status_port": -1}, {}, "status_port must be an int"),
        ({"status_port": "8470"}, {}, "status_port must be an int"),
        ({}, {"ACTORCH_STATUS_PORT": "http"}, "ACTORCH_STATUS_PORT must be a port"),
        ({"status": "no"}, {}, r"status must be True \(serve it, the default\) or False \(serve none\), not 'no'"),
        ({"status": False, "status_port": 8470}, {}, "status_port=8470 was given with status=False"),
        ({"status_host": ""}, {}, "status_host must be an address"),
        ({}, {"ACTORCH_WORLD_SIZE": "0"}, "ACTORCH_WORLD_SIZE must be a positive int"),
    ],
)
def test_run_refuses_bad_status_ports_and_world_sizes(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], env: dict[str, str], match: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    async def main(system: actorch.ActorSystem) -> None:
        raise AssertionError("main must not run")

    with pytest.raises(ValueError, match=match):
        actorch.run(main, configure_logs=False, **kwargs)


def test_run_refuses_a_taken_status_port_before_any_worker_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_module, "_launch_local", lambda *args: pytest.fail("workers started"))
    with socket.create_server(("127.0.0.1", 0)) as taken:

        async def main(system: actorch.ActorSystem) -> None:
            raise AssertionError("main must not run")

        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"status port {port} on 127.0.0.1 is in use"):
            actorch.run(main, world_size=3, status_port=port, configure_logs=False)


@pytest.mark.parametrize(
    ("kwargs", "env", "served"),
    [
        ({}, {}, ("127.0.0.1", 0)),  # on by default, on a free port
        ({"status_port": 8470}, {"ACTORCH_STATUS_PORT": "9000"}, ("127.0.0.1", 8470)),
        ({}, {"ACTORCH_STATUS_PORT": "9000"}, ("127.0.0.1", 9000)),
        ({"status_host": "::1"}, {}, ("::1", 0)),
        ({"status": False}, {}, None),
        ({}, {"ACTORCH_STATUS_PORT": "off"}, None),  # actorch run --no-status
        ({"status": False}, {"ACTORCH_STATUS_PORT": "9000"}, None),
    ],
)
def test_run_serves_the_status_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], env: dict[str, str], served: tuple[str, int] | None
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(run_module, "_launch_local", lambda *args: seen.append(args))
    monkeypatch.setattr(run_module, "check_status_port", lambda *args: None)
    monkeypatch.delenv("ACTORCH_STATUS_PORT", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    async def main(system: actorch.ActorSystem) -> None:
        raise AssertionError("main must not run")

    actorch.run(main, configure_logs=False, **kwargs)
    assert seen[0][3].status == served


def test_actorch_run_sets_the_world_size_in_place_of_the_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(run_module, "_launch_local", lambda *args: seen.append(args))
    monkeypatch.setenv("ACTORCH_WORLD_SIZE", "4")

    async def main(system: actorch.ActorSystem) -> None:
        raise AssertionError("main must not run")

    with structlog.testing.capture_logs() as logs:
        actorch.run(main, world_size=3, configure_logs=False)
    assert seen[0][1] == 4
    ignored = "run(world_size=3) is ignored: actorch run started 4 processes, and the launcher's count is the system's"
    assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == [ignored]


async def test_metrics_without_prometheus_client_say_what_to_install(
    world: LocalWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    server = StatusServer(world._hosts[0], "127.0.0.1", 0)
    await server.start()
    try:
        code, body = await _request(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert code == 501
        assert b"actorch[metrics]" in body
        assert (await _request(server.port, b"GET /status HTTP/1.1\r\n\r\n"))[0] == 200  # the status needs none
    finally:
        await server.close()
