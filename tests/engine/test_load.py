"""Load without loss: every call answered exactly once, every tell applied exactly once, memory flat.

8 callers on 4 ranks send numbered calls and tells to one counting actor, with
a small ``mailbox_size`` so that backpressure is hit all the time: calls wait
for room and tells raise ``MailboxFullError`` (nothing sent), which the callers
answer by waiting and sending again. The default suite sends 16,000 messages;
``pytest -m load`` sends the full 200,000 (100,000 calls and 100,000 tells).
"""

from __future__ import annotations

from typing import Any

import pytest
from _mp import run_script

MAILBOX = 64
WINDOW = 32  # calls in flight per caller; two callers per node fill a 64-message window by themselves
RSS_GROWTH_MB = 32.0


def check_accounting(messages: int) -> dict[str, Any]:
    run = run_script("load.py", str(messages), str(MAILBOX), str(WINDOW), timeout=240)
    run.assert_clean_exit(0)
    r = run.result("load")
    tally = r["tally"]
    assert r["messages"] == messages
    assert tally["missing"] == [0] * 8, "every message must arrive"
    assert tally["duplicates"] == 0, "no message may arrive twice"
    assert tally["handled"] == messages + 2  # on_start and the memory mark
    for caller in r["callers"]:
        assert caller["answered_once"] == caller["expected_calls"], caller
        assert caller["wrong"] == 0, caller
    assert tally["queued_peak"] <= MAILBOX * r["senders"], "the mailbox bound held"
    assert sum(caller["mailbox_full"] for caller in r["callers"]) > 0, "the bound was reached and reported"
    assert tally["rss_end_mb"] - tally["rss_start_mb"] < RSS_GROWTH_MB, tally
    return r


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_load_of_16000_messages_loses_nothing_and_keeps_memory_flat() -> None:
    check_accounting(16_000)


@pytest.mark.multiprocess
@pytest.mark.load
@pytest.mark.timeout(300)
def test_load_of_100000_calls_and_100000_tells_loses_nothing_and_keeps_memory_flat() -> None:
    check_accounting(200_000)
