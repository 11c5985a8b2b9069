"""OpenTelemetry spans of a real three-process chain, each process exporting its own, joined into one trace.

The script (``mp_scripts/otel_chain.py``) sets up the SDK on every node in
``setup`` and writes each node's spans to a file of its own; the test reads
the three files back as a collector would join them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from _mp import SCRIPTS, run_argv, run_script

pytest.importorskip(
    "opentelemetry.sdk.trace", reason="the otel tests need opentelemetry-sdk (pip install 'actorch[test]')"
)

pytestmark = pytest.mark.multiprocess


def read_spans(directory: Path) -> dict[str, dict[str, Any]]:
    """Every node's spans, by span id, each with the rank of the file it was in."""
    spans = {}
    for rank in range(3):
        for line in (directory / f"spans-{rank}.jsonl").read_text().splitlines():
            span = json.loads(line)
            spans[span["id"]] = {**span, "rank": rank}
    return spans


def children(spans: dict[str, dict[str, Any]], parent: str) -> list[dict[str, Any]]:
    return [span for span in spans.values() if span["parent"] == parent]


def only_child(spans: dict[str, dict[str, Any]], parent: str, kind: str) -> dict[str, Any]:
    [child] = [span for span in children(spans, parent) if span["kind"] == kind]
    return child


def check_chain(spans: dict[str, dict[str, Any]], chain: dict[str, Any]) -> None:
    """user step -> call a -> a's handler (node 1) -> call b -> b's (node 2) -> call c -> c's (node 0), one trace."""
    assert chain["result"] == 4
    pids = {int(rank): pid for rank, pid in chain["pids"].items()}
    step = spans[chain["spans"]["step"]]
    assert (step["name"], step["kind"], step["rank"]) == ("user step", "INTERNAL", 0)
    parent, hops = step, []
    for caller_rank, callee_rank, actor in ((0, 1, "a"), (1, 2, "b"), (2, 0, "c")):
        call = only_child(spans, parent["id"], "CLIENT")
        handler = only_child(spans, call["id"], "SERVER")
        hops += [call, handler]
        assert call["name"] == handler["name"] == "Hop/relay"
        assert (call["rank"], call["pid"]) == (caller_rank, pids[caller_rank])  # made where the call was
        assert (handler["rank"], handler["pid"]) == (callee_rank, pids[callee_rank])  # and its handler where it ran
        assert not call["remote_parent"]
        assert handler["remote_parent"]  # its parent came in the message
        assert call["attributes"]["actorch.node"] == handler["attributes"]["actorch.peer.node"] == caller_rank
        assert handler["attributes"]["actorch.node"] == call["attributes"]["actorch.peer.node"] == callee_rank
        # No tensors: the fast lane, or torch RPC while a lane's handshake is still under way on a loaded machine.
        assert call["attributes"]["actorch.path"] in ("lane", "torch_rpc")
        assert call["attributes"]["actorch.bytes"] > 0
        for span in (call, handler):
            assert span["attributes"]["rpc.system"] == "actorch"
            assert span["attributes"]["rpc.service"] == "Hop"
            assert span["attributes"]["rpc.method"] == "relay"
            assert span["attributes"]["actorch.actor"] == f"actor {actor!r} (Hop) on node {callee_rank}"
            assert span["attributes"]["actorch.outcome"] == "ok"
            assert span["status"] == "UNSET"
        parent = handler
    assert children(spans, parent["id"]) == []  # c answers without calling on
    assert {span["trace"] for span in hops} == {step["trace"]}
    # The error: the user's span -> the call (ERROR, the exception recorded) -> b's handler on node 2 (the same).
    failure = spans[chain["spans"]["failure"]]
    assert chain["raised"] == "RemoteError(ValueError)"  # main caught it as a ValueError
    call = only_child(spans, failure["id"], "CLIENT")
    handler = only_child(spans, call["id"], "SERVER")
    assert (call["name"], call["rank"], handler["rank"]) == ("Hop/fail", 0, 2)
    for span in (call, handler):
        assert span["status"] == "ERROR"
        assert span["attributes"]["actorch.outcome"] == "error"
        assert span["attributes"]["error.type"] == "ValueError"
        assert span["events"] == ["exception"]
        assert span["trace"] == failure["trace"] != step["trace"]
    # A tell: a PRODUCER span on main, its handler a CONSUMER child on node 1.
    note = spans[chain["spans"]["note"]]
    told = only_child(spans, note["id"], "PRODUCER")
    handled = only_child(spans, told["id"], "CONSUMER")
    assert (told["name"], told["rank"], handled["name"], handled["rank"]) == ("Hop/note", 0, "Hop/note", 1)


@pytest.mark.timeout(120)
def test_otel_spans_of_a_three_node_chain_are_one_trace_of_parents_and_children(tmp_path: Path) -> None:
    run = run_script("otel_chain.py", str(tmp_path), timeout=100)
    run.assert_clean_exit(0)
    check_chain(read_spans(tmp_path), run.result("chain"))


@pytest.mark.timeout(120)
def test_actorch_run_otel_turns_the_same_spans_on(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "actorch", "run", "-n", "3", "--otel", str(SCRIPTS / "otel_chain.py"), str(tmp_path)]
    run = run_argv([*argv, "cli"], timeout=100)
    run.assert_clean_exit(0)
    check_chain(read_spans(tmp_path), run.result("chain"))
