"""An actor's error that escapes ``main`` prints like a local one: the remote frames under the local ones."""

from __future__ import annotations

import re

import pytest
from _mp import Finished, run_script

pytestmark = pytest.mark.multiprocess

RAISED = 'raise ValueError(f"a {rows}x{cols} matrix is not square")'


@pytest.fixture(scope="module")
def printed() -> Finished:
    return run_script("tracebacks.py", timeout=60)


@pytest.mark.timeout(90)
def test_uncaught_remote_error_prints_the_remote_frames_under_the_local_ones(printed: Finished) -> None:
    printed.assert_clean_exit(1)
    stderr = printed.stderr
    local = stderr.index("await there.call(Checker.check, 3, 4)")
    error = stderr.index("actorch.RemoteError(ValueError): a 3x4 matrix is not square")
    where = re.search(r"Raised in 'check' of actor 'shapes/there' \(Checker\) on node 1, pid \d+ on host \S+", stderr)
    assert where is not None, printed.report()
    remote = stderr.index(RAISED, where.end())
    assert local < error < where.start() < remote, printed.report()
    assert "ValueError: a 3x4 matrix is not square" in stderr[remote:]
    assert "actorch._base" not in stderr
    assert "cell.py" not in stderr, "the runtime's frames that ran the handler are left out"


@pytest.mark.timeout(90)
def test_same_node_error_prints_like_a_remote_one(printed: Finished) -> None:
    text = printed.result("same_node")["text"]
    assert "actorch.RemoteError(ValueError): a 2x3 matrix is not square" in text
    assert re.search(r"Raised in 'check' of actor 'shapes/here' \(Checker\) on node 0, pid \d+", text), text
    assert RAISED in text
    assert "During handling" not in text, "the handler's error is printed once"
    assert "direct cause" not in text


@pytest.mark.timeout(90)
def test_stream_error_prints_the_producer_frames(printed: Finished) -> None:
    text = printed.result("stream")["text"]
    assert "actorch.RemoteError(KeyError): 'row 2 is missing'" in text
    assert re.search(r"Raised in 'rows' of actor 'shapes/there' \(Checker\) on node 1, pid \d+", text), text
    assert 'raise KeyError(f"row {count} is missing")' in text


@pytest.mark.timeout(90)
def test_error_passed_on_by_a_handler_prints_every_hop(printed: Finished) -> None:
    text = printed.result("chain")["text"]
    relay = text.index("Raised in 'relay' of actor 'shapes/here' (Checker) on node 0")
    middle = text.index("return await other.call(Checker.check, rows, cols)", relay)
    check = text.index("  Raised in 'check' of actor 'shapes/there' (Checker) on node 1", middle)
    assert text.index(RAISED, check) > check
    assert "actorch.RemoteError(ValueError): a 4x5 matrix is not square" in text[:relay], "still a ValueError"
