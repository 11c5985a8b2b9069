"""``run`` waits for the worker processes it started: none is left behind when it returns, zombie or not."""

from __future__ import annotations

import pytest
from _mp import run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def test_run_leaves_no_worker_process_behind_in_the_process_table() -> None:
    run = run_script("tidy_exit.py", timeout=90.0)
    run.assert_clean_exit(0)
    returned = run.returned()
    assert returned["returned"] == 3
    # multiprocessing's own resource tracker and forkserver (which the workers fork from) stay until this process
    # exits, as they do for any program that uses them; nothing of actorch's does
    helpers = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
    left = [child for child in returned["children"] if not any(helper in child["command"] for helper in helpers)]
    assert left == [], run.report()
