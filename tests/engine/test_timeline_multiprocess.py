"""Timelines of real three-node runs (run(trace=), actorch run --trace, sampling), read back as a viewer would."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _mp import SCRIPTS, run_argv, run_script

from actorch._engine.timeline import flows

pytestmark = pytest.mark.multiprocess


def tracks(document: dict[str, Any]) -> dict[tuple[int, int], str]:
    """Each (pid, tid) of the document and its track's name."""
    return {
        (event["pid"], event["tid"]): event["args"]["name"]
        for event in document["traceEvents"]
        if event["ph"] == "M" and event["name"] == "thread_name"
    }


def spans(document: dict[str, Any], cat: str) -> list[dict[str, Any]]:
    return [event for event in document["traceEvents"] if event["ph"] == "X" and event["cat"] == cat]


def on_track(document: dict[str, Any], event: dict[str, Any]) -> str:
    return tracks(document)[(event["pid"], event["tid"])]


def check_chain(document: dict[str, Any], chain: dict[str, Any]) -> None:
    """The chain main -> a (node 1) -> b (node 2) -> c (node 0), as main saw it, is in the file as it ran."""
    assert chain["results"] == [i + 3 for i in range(20)]
    processes = {
        event["pid"]: event["args"]["name"] for event in document["traceEvents"] if event["name"] == "process_name"
    }
    assert sorted(processes) == [1, 2, 3]  # one process per node, pid = rank + 1
    for rank, pid in chain["pids"].items():
        assert processes[int(rank) + 1].startswith(f"node {rank} (")
        assert f"pid {pid})" in processes[int(rank) + 1]
    handlers = spans(document, "handler")
    relays = Counter((event["pid"], on_track(document, event)) for event in handlers if event["name"] == "relay")
    assert relays == {
        (2, "actor 'a' (Hop) on node 1"): 20,
        (3, "actor 'b' (Hop) on node 2"): 20,
        (1, "actor 'c' (Hop) on node 0"): 20,
    }
    calls = [event for event in spans(document, "call") if event["name"] == "call relay"]
    callers = Counter((event["pid"], on_track(document, event).split(" (")[0]) for event in calls)
    assert callers == {(1, "main"): 20, (2, "actor 'a'"): 20, (3, "actor 'b'"): 20}
    # No tensors: the fast lane, or torch RPC while a lane's handshake is still under way on a loaded machine.
    assert {event["args"]["path"] for event in calls} <= {"lane", "torch_rpc"}
    assert all(event["args"]["bytes"] > 0 and event["args"]["outcome"] == "ok" for event in calls)
    # Every arrow goes from a send to the handler that ran it, and the handler starts after the send.
    arrows = list(flows(document))
    by_id = {event["id"]: event for event in document["traceEvents"] if event["ph"] == "s"}
    assert len(arrows) == len(by_id)  # every send's arrow ends at a handler
    for start, finish in arrows:
        assert finish["ts"] >= start["ts"], (start, finish)
    # A call from a handler nests in it: b's calls to c lie within b's relay handlers.
    b_handlers = [event for event in handlers if on_track(document, event).startswith("actor 'b'")]
    b_calls = [event for event in calls if on_track(document, event).startswith("actor 'b'")]
    for call in b_calls:
        assert any(h["ts"] <= call["ts"] and call["ts"] + call["dur"] <= h["ts"] + h["dur"] + 0.001 for h in b_handlers)
    tells = spans(document, "tell")
    assert len(tells) == 20
    assert {event["name"] for event in tells} == {"tell note"}
    notes = [event for event in handlers if event["name"] == "note"]
    assert len(notes) == 20
    waits = [event for event in document["traceEvents"] if event["ph"] == "b" and event["cat"] == "wait"]
    assert any(event["name"] == "mailbox of actor 'busy' (Busy) on node 2" for event in waits)
    failed = [event for event in handlers if event["name"] == "fail"]
    assert [event["args"]["outcome"] for event in failed] == ["error"]
    assert [event["args"]["outcome"] for event in spans(document, "call") if event["name"] == "call fail"] == ["error"]
    assert chain["counted"] == [0, 1, 2, 3, 4]
    [stream] = spans(document, "stream")
    assert stream["name"] == "stream count"
    assert on_track(document, stream) == "main"
    assert stream["args"]["outcome"] == "ended"
    assert stream["args"]["path"] in ("lane", "torch_rpc")
    [producing] = [event for event in handlers if event["name"] == "count"]
    assert on_track(document, producing) == "actor 'b' (Hop) on node 2"
    assert any(start["ts"] == stream["ts"] and finish["ts"] == producing["ts"] for start, finish in arrows)
    items = spans(document, "item")
    assert [item["args"]["index"] for item in items] == [0, 1, 2, 3, 4]
    assert all(on_track(document, item) == "actor 'b' (Hop) on node 2" for item in items)
    assert document["otherData"]["missing"] == []
    assert all(node["offset_ns"] == 0 for node in document["otherData"]["nodes"].values())  # one machine, one clock


@pytest.mark.timeout(120)
def test_run_trace_writes_a_timeline_of_a_three_node_chain(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    run = run_script("trace_chain.py", str(path), timeout=100)
    run.assert_clean_exit(0)
    check_chain(json.loads(path.read_text()), run.result("chain"))


@pytest.mark.timeout(120)
def test_actorch_run_trace_writes_the_same_timeline(tmp_path: Path) -> None:
    path = tmp_path / "cli.json"
    argv = [
        sys.executable,
        "-m",
        "actorch",
        "run",
        "-n",
        "3",
        "--trace",
        str(path),
        str(SCRIPTS / "trace_chain.py"),
        "-",
    ]
    run = run_argv(argv, timeout=100)
    run.assert_clean_exit(0)
    check_chain(json.loads(path.read_text()), run.result("chain"))


@pytest.mark.timeout(120)
def test_a_sampled_trace_keeps_whole_calls_only(tmp_path: Path) -> None:
    path = tmp_path / "sampled.json"
    run = run_script("trace_chain.py", str(path), "0.3", timeout=100)
    run.assert_clean_exit(0)
    document = json.loads(path.read_text())
    relays = [event for event in spans(document, "handler") if event["name"] == "relay"]
    assert 0 < len(relays) < 60  # some of the 60 hops, not all
    sends = {event["id"] for event in document["traceEvents"] if event["ph"] == "s"}
    finishes = {event["id"] for event in document["traceEvents"] if event["ph"] == "f"}
    assert sends == finishes  # both ends decided alike: no arrow without its handler, no handler without its call
    assert document["otherData"]["sample"] == 0.3
    timeline = run.result("timeline")
    assert timeline["dropped"] == 0
    assert timeline["missing"] == []
    assert timeline["events"] == len([event for event in document["traceEvents"] if event["ph"] in "Xb"])
